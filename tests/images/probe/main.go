// Command probe is what the integration tests run inside Pods where busybox cannot help: a
// name lookup and an HTTP(S) GET through the Go resolver (busybox-static's glibc resolver
// crashes), with a CA and a bearer token for the Kubernetes API; and a validating admission
// webhook (HTTPS) that refuses objects of one name. Standard library only, built statically
// (CGO_ENABLED=0) into the tests' busybox image.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
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
	fmt.Fprintln(os.Stderr, "usage: probe lookup NAME | probe get [--ca FILE] [--bearer-file FILE] URL | probe webhook --cert FILE --key FILE --deny NAME [--listen ADDR]")
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
	case "webhook":
		fs := flag.NewFlagSet("webhook", flag.ExitOnError)
		cert := fs.String("cert", "", "PEM serving certificate")
		key := fs.String("key", "", "PEM key")
		deny := fs.String("deny", "", "refuse objects of this name")
		listen := fs.String("listen", ":8443", "address to serve HTTPS on")
		_ = fs.Parse(os.Args[2:])
		if *cert == "" || *key == "" || *deny == "" {
			usage()
		}
		os.Exit(webhook(*listen, *cert, *key, *deny))
	default:
		usage()
	}
}

// review is the part of an admission.k8s.io/v1 AdmissionReview the webhook reads.
type review struct {
	Request struct {
		UID    string `json:"uid"`
		Object struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		} `json:"object"`
	} `json:"request"`
}

// webhook serves /validate: every object is admitted but those named deny.
func webhook(listen, cert, key, deny string) int {
	http.HandleFunc("/validate", func(w http.ResponseWriter, r *http.Request) {
		var in review
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		name := in.Request.Object.Metadata.Name
		resp := map[string]any{"uid": in.Request.UID, "allowed": name != deny}
		if name == deny {
			resp["status"] = map[string]any{"code": 403, "message": "probe webhook refuses " + name}
		}
		fmt.Printf("review %s: %s allowed=%v\n", in.Request.UID, name, name != deny)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": resp,
		})
	})
	fmt.Println("webhook serving on", listen)
	if err := http.ListenAndServeTLS(listen, cert, key, nil); err != nil {
		fmt.Fprintln(os.Stderr, "webhook:", err)
		return 1
	}
	return 0
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
