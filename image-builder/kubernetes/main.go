// Command kube is a multicall binary holding the upstream Kubernetes socialweb ships: the
// control plane the broker runs per tenant cluster (etcd embedded, apiserver,
// controller-manager, scheduler), the node parts the node image carries (kubelet, kube-proxy)
// and kubectl. Called as `kube <component>` or through a symlink named after the component.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	_ "time/tzdata"

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectl "k8s.io/kubectl/pkg/cmd"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	name := filepath.Base(os.Args[0])
	args := os.Args[1:]
	if name == "kube" {
		if len(args) == 0 {
			fmt.Fprintln(os.Stderr, "usage: kube <apiserver|controller-manager|scheduler|kubelet|proxy|kubectl|etcd> [flags]")
			os.Exit(2)
		}
		name, args = args[0], args[1:]
	}
	var cmd *cobra.Command
	switch name {
	case "apiserver", "kube-apiserver":
		cmd = apiserver.NewAPIServerCommand()
	case "controller-manager", "kube-controller-manager":
		cmd = controllermanager.NewControllerManagerCommand()
	case "scheduler", "kube-scheduler":
		cmd = scheduler.NewSchedulerCommand()
	case "kubelet":
		cmd = kubelet.NewKubeletCommand(context.Background())
	case "proxy", "kube-proxy":
		cmd = proxy.NewProxyCommand()
	case "kubectl":
		cmd = kubectl.NewDefaultKubectlCommand()
	case "etcd":
		os.Exit(runEtcd(args))
	default:
		fmt.Fprintf(os.Stderr, "kube: unknown component %q\n", name)
		os.Exit(2)
	}
	cmd.SetArgs(args)
	os.Exit(cli.Run(cmd))
}

// runEtcd starts a single-member etcd bound to loopback and runs until SIGTERM/SIGINT. With
// --cert-file, --key-file and --trusted-ca-file its clients speak TLS and must present a
// certificate of that CA (CIS Kubernetes Benchmark 2.1, 2.2); the --peer-* files do the same
// for the peer port.
func runEtcd(args []string) int {
	fs := flag.NewFlagSet("etcd", flag.ExitOnError)
	dataDir := fs.String("data-dir", "", "data directory (required)")
	client := fs.String("listen-client-url", "http://127.0.0.1:2379", "client URL")
	peer := fs.String("listen-peer-url", "http://127.0.0.1:2380", "peer URL")
	certFile := fs.String("cert-file", "", "client port's serving certificate")
	keyFile := fs.String("key-file", "", "its key")
	trustedCA := fs.String("trusted-ca-file", "", "CA every client certificate must be of")
	peerCert := fs.String("peer-cert-file", "", "peer port's certificate (server and client)")
	peerKey := fs.String("peer-key-file", "", "its key")
	peerCA := fs.String("peer-trusted-ca-file", "", "CA every peer certificate must be of")
	_ = fs.Parse(args)
	if *dataDir == "" {
		fmt.Fprintln(os.Stderr, "etcd: --data-dir is required")
		return 2
	}
	cu, err := url.Parse(*client)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: --listen-client-url: %v\n", err)
		return 2
	}
	pu, err := url.Parse(*peer)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: --listen-peer-url: %v\n", err)
		return 2
	}
	cfg := embed.NewConfig()
	cfg.Dir = *dataDir
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	cfg.LogLevel = "warn"
	if *certFile != "" {
		cfg.ClientTLSInfo = transport.TLSInfo{
			CertFile:       *certFile,
			KeyFile:        *keyFile,
			TrustedCAFile:  *trustedCA,
			ClientCertAuth: *trustedCA != "",
		}
	}
	if *peerCert != "" {
		cfg.PeerTLSInfo = transport.TLSInfo{
			CertFile:       *peerCert,
			KeyFile:        *peerKey,
			TrustedCAFile:  *peerCA,
			ClientCertAuth: *peerCA != "",
		}
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		return 1
	}
	defer e.Close()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-e.Server.ReadyNotify():
		fmt.Fprintln(os.Stderr, "etcd: ready on", cu.String())
	case err := <-e.Err():
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		return 1
	}
	select {
	case <-sig:
		return 0
	case err := <-e.Err():
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		return 1
	}
}
