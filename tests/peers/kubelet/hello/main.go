// Command hello is the application the real-node tests deploy: a container that answers HTTP, so
// that a Eureka client in another pod can be shown to reach it at the address the operator
// registered. It needs nothing but the standard library and is built static into an image FROM
// scratch.
//
//	hello [-listen :8080]
//
// GET / answers {"pod": $POD_NAME, "ip": $POD_IP, "host": <hostname>}; GET /healthz answers ok.
// SIGTERM ends it after its open requests (up to 5 s).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"log"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	listen := flag.String("listen", ":8080", "address to serve on")
	flag.Parse()
	host, _ := os.Hostname()
	who := map[string]string{"pod": os.Getenv("POD_NAME"), "ip": os.Getenv("POD_IP"), "host": host}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(who)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	server := &http.Server{Addr: *listen, Handler: mux, ReadHeaderTimeout: 10 * time.Second}

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = server.Shutdown(ctx)
	}()
	log.Printf("serving on %s as %v", *listen, who)
	if err := server.ListenAndServe(); err != nil && err != http.ErrServerClosed {
		log.Fatal(err)
	}
}
