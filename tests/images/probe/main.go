// Command probe is what the integration tests run inside Pods where busybox cannot help: a
// name lookup and an HTTP(S) GET through the Go resolver (busybox-static's glibc resolver
// crashes), with a CA and a bearer token for the Kubernetes API. Standard library only, built
// statically (CGO_ENABLED=0) into the tests' busybox image.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

func usage() {
	fmt.Fprintln(os.Stderr, "usage: probe lookup NAME | probe get [--ca FILE] [--bearer-file FILE] URL")
	os.Exit(2)
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	switch os.Args[1] {
	case "lookup":
		if len(os.Args) != 3 {
			usage()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		addrs, err := net.DefaultResolver.LookupHost(ctx, os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, "lookup:", err)
			os.Exit(1)
		}
		fmt.Println(strings.Join(addrs, " "))
	case "get":
		fs := flag.NewFlagSet("get", flag.ExitOnError)
		ca := fs.String("ca", "", "PEM file of the CA to verify the server with")
		bearer := fs.String("bearer-file", "", "file holding a bearer token")
		_ = fs.Parse(os.Args[2:])
		if fs.NArg() != 1 {
			usage()
		}
		os.Exit(get(fs.Arg(0), *ca, *bearer))
	default:
		usage()
	}
}

func get(url, caFile, bearerFile string) int {
	tr := &http.Transport{}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "get:", err)
			return 1
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			fmt.Fprintln(os.Stderr, "get: no certificate in", caFile)
			return 1
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	}
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "get:", err)
		return 1
	}
	if bearerFile != "" {
		tok, err := os.ReadFile(bearerFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "get:", err)
			return 1
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		fmt.Fprintln(os.Stderr, "get:", err)
		return 1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	fmt.Printf("%d %s\n", resp.StatusCode, strings.TrimSpace(string(body)))
	if resp.StatusCode/100 != 2 {
		return 1
	}
	return 0
}
