// echo: the backend the node suites run in pods (no image is ever pulled,
// so the tests bring their own). HTTP on :8080 answers every request with a
// JSON document of what it saw: the pod that served it, the method, host,
// path and the forwarding headers, so a test can tell which pod behind a
// Service answered and what the proxy in front passed on. TCP on :9000
// echoes every byte back (the TCPEndpoint journey). Readiness: GET /healthz.
package main

import (
	"encoding/json"
	"io"
	"log"
	"net"
	"net/http"
	"os"
)

func main() {
	pod := os.Getenv("POD_NAME")
	if pod == "" {
		pod, _ = os.Hostname()
	}
	go func() {
		l, err := net.Listen("tcp", ":9000")
		if err != nil {
			log.Fatal(err)
		}
		for {
			c, err := l.Accept()
			if err != nil {
				log.Fatal(err)
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	http.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]string{
			"pod":             pod,
			"method":          r.Method,
			"host":            r.Host,
			"path":            r.URL.Path,
			"xForwardedHost":  r.Header.Get("X-Forwarded-Host"),
			"xForwardedProto": r.Header.Get("X-Forwarded-Proto"),
			"xForwardedFor":   r.Header.Get("X-Forwarded-For"),
		})
	})
	log.Fatal(http.ListenAndServe(":8080", nil))
}
