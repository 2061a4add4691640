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
	"time"
	_ "time/tzdata"

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/snapshot"
	restore "go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectl "k8s.io/kubectl/pkg/cmd"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	name := filepath.Base(os.Args[0])
	args := os.Args[1:]
	if name == "kube" {
		if len(args) == 0 {
			fmt.Fprintln(os.Stderr, "usage: kube <apiserver|controller-manager|scheduler|kubelet|proxy|kubectl|etcd|etcd-snapshot> [flags]")
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
	case "etcd-snapshot":
		os.Exit(runEtcdSnapshot(args))
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

// The embedded etcd's member as runEtcd makes it (embed's defaults): what a restore must
// name for the restored data directory to start as that member.
const (
	memberName   = "default"
	clusterToken = "etcd-cluster"
)

// runEtcdSnapshot is etcdctl's `snapshot save` and etcdutl's `snapshot restore` for the
// embedded etcd (the broker's backups, docs/operations.md):
//
//	kube etcd-snapshot save --endpoint URL --cacert F --cert F --key F OUT
//	kube etcd-snapshot restore --data-dir DIR --peer-url URL SNAPSHOT
//
// save writes a consistent snapshot of a serving etcd (its hash checked by restore);
// restore makes a new data directory DIR (which must not exist) holding it, as the one
// member runEtcd starts with --listen-peer-url URL.
func runEtcdSnapshot(args []string) int {
	if len(args) == 0 || (args[0] != "save" && args[0] != "restore") {
		fmt.Fprintln(os.Stderr, "usage: kube etcd-snapshot save --endpoint URL --cacert F --cert F --key F OUT | restore --data-dir DIR --peer-url URL SNAPSHOT")
		return 2
	}
	lg := zap.NewNop()
	fs := flag.NewFlagSet("etcd-snapshot "+args[0], flag.ExitOnError)
	if args[0] == "save" {
		endpoint := fs.String("endpoint", "", "the serving etcd's client URL")
		cacert := fs.String("cacert", "", "the CA its serving certificate is of")
		cert := fs.String("cert", "", "a client certificate of the CA it checks clients against")
		key := fs.String("key", "", "its key")
		_ = fs.Parse(args[1:])
		if *endpoint == "" || fs.NArg() != 1 {
			fmt.Fprintln(os.Stderr, "etcd-snapshot save: --endpoint and one output file are required")
			return 2
		}
		tlsInfo := transport.TLSInfo{CertFile: *cert, KeyFile: *key, TrustedCAFile: *cacert}
		tlsCfg, err := tlsInfo.ClientConfig()
		if err != nil {
			fmt.Fprintf(os.Stderr, "etcd-snapshot save: TLS: %v\n", err)
			return 1
		}
		cfg := clientv3.Config{Endpoints: []string{*endpoint}, TLS: tlsCfg, DialTimeout: 10 * time.Second, Logger: lg}
		// Asked first, with a short deadline: an etcd that is not there (or refuses the
		// certificate) fails the backup in seconds, not at the snapshot's deadline.
		if err := reachable(cfg, *endpoint); err != nil {
			fmt.Fprintf(os.Stderr, "etcd-snapshot save: %s: %v\n", *endpoint, err)
			return 1
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		version, err := snapshot.SaveWithVersion(ctx, lg, cfg, fs.Arg(0))
		if err != nil {
			fmt.Fprintf(os.Stderr, "etcd-snapshot save: %s: %v\n", *endpoint, err)
			return 1
		}
		fmt.Fprintf(os.Stderr, "etcd-snapshot: saved %s (etcd %s)\n", fs.Arg(0), version)
		return 0
	}
	dataDir := fs.String("data-dir", "", "the new data directory (must not exist)")
	peer := fs.String("peer-url", "", "the member's peer URL, as runEtcd's --listen-peer-url")
	_ = fs.Parse(args[1:])
	if *dataDir == "" || *peer == "" || fs.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "etcd-snapshot restore: --data-dir, --peer-url and one snapshot file are required")
		return 2
	}
	err := restore.NewV3(lg).Restore(restore.RestoreConfig{
		SnapshotPath:        fs.Arg(0),
		Name:                memberName,
		OutputDataDir:       *dataDir,
		PeerURLs:            []string{*peer},
		InitialCluster:      memberName + "=" + *peer,
		InitialClusterToken: clusterToken,
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd-snapshot restore: %s: %v\n", fs.Arg(0), err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "etcd-snapshot: restored %s into %s\n", fs.Arg(0), *dataDir)
	return 0
}

// reachable asks the etcd at endpoint for its status within 10 seconds.
func reachable(cfg clientv3.Config, endpoint string) error {
	cli, err := clientv3.New(cfg)
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = cli.Status(ctx, endpoint)
	return err
}
