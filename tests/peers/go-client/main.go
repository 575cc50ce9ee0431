// Command go-peer is a Go Eureka client test peer built on github.com/hudl/fargo: it registers an
// instance, heartbeats it (registering again when the server answers 404), fetches the whole
// registry with fargo on every interval, and deregisters on SIGTERM. It serves, on the port it
// registers:
//
//	GET /stats           counters: requests by kind and status, and hash-code mismatches
//	GET /seen-all/{APP}  [{id, status}] of APP in the last registry fargo fetched
//	GET /hello           its own instance id (a callee for the load-balancer tests)
//
// fargo has no delta support (its Config.EnableDelta is a TODO), so every fetch is a full one. A
// hash-code mismatch here means that the instances fargo decoded do not add up to the
// apps__hashcode the server put in the same response, i.e. fargo's codec lost or misread something.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hudl/fargo"
)

type counters struct {
	mu         sync.Mutex
	http       map[string]int
	lastHash   string // apps__hashcode of the last full-registry response
	mismatches int
	lastLocal  string
	seen       map[string][]map[string]string
	remote     string
}

var stats = counters{http: map[string]int{}, seen: map[string][]map[string]string{}}

var hashRe = regexp.MustCompile(`"?apps__hashcode"?\s*[:>]\s*"?([A-Z_0-9]*)`)

// recorder counts every request fargo sends and keeps the apps__hashcode of full fetches.
type recorder struct{ next http.RoundTripper }

func (r recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	kind := classify(req.Method, req.URL.Path)
	resp, err := r.next.RoundTrip(req)
	status := -1
	if err == nil {
		status = resp.StatusCode
		if kind == "fullFetch" && status == 200 {
			body, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if rerr != nil {
				return nil, rerr
			}
			resp.Body = io.NopCloser(bytes.NewReader(body))
			if m := hashRe.FindSubmatch(body); m != nil {
				stats.mu.Lock()
				stats.lastHash = string(m[1])
				stats.mu.Unlock()
			}
		}
	}
	stats.mu.Lock()
	stats.http[kind]++
	stats.http[fmt.Sprintf("%s.%d", kind, status)]++
	stats.mu.Unlock()
	return resp, err
}

func classify(method, path string) string {
	at := strings.LastIndex(path, "/apps")
	if at < 0 {
		return "other"
	}
	rest := strings.Trim(path[at+len("/apps"):], "/")
	var seg []string
	if rest != "" {
		seg = strings.Split(rest, "/")
	}
	switch {
	case method == "GET" && len(seg) == 0:
		return "fullFetch"
	case method == "GET" && len(seg) == 1 && seg[0] == "delta":
		return "deltaFetch"
	case method == "POST" && len(seg) == 1:
		return "register"
	case method == "PUT" && len(seg) == 2:
		return "heartbeat"
	case method == "DELETE" && len(seg) == 2:
		return "cancel"
	}
	return "other"
}

// reconcileHash is Eureka's apps hash code: STATUS_count_ for every status, in status order.
func reconcileHash(apps map[string]*fargo.Application) string {
	byStatus := map[string]int{}
	for _, a := range apps {
		for _, i := range a.Instances {
			byStatus[string(i.Status)]++
		}
	}
	keys := make([]string, 0, len(byStatus))
	for k := range byStatus {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s_%d_", k, byStatus[k])
	}
	return b.String()
}

func main() {
	server := flag.String("server", "", "Eureka service URL, e.g. http://127.0.0.1:8761/eureka")
	app := flag.String("app", "", "application name")
	id := flag.String("id", "", "instance id")
	host := flag.String("host", "127.0.0.1", "address to register and listen on")
	port := flag.Int("port", 0, "port to register and listen on")
	useJSON := flag.Bool("json", false, "use fargo's JSON codec instead of its default XML")
	interval := flag.Duration("interval", time.Second, "heartbeat and fetch interval")
	flag.Parse()
	if *server == "" || *app == "" || *id == "" || *port == 0 {
		fmt.Fprintln(os.Stderr, "usage: go-peer --server URL --app NAME --id ID --port P [--json] [--interval 1s]")
		os.Exit(2)
	}
	fargo.HttpClient.Transport = recorder{next: fargo.HttpClient.Transport}
	conn := fargo.NewConn(*server)
	conn.UseJson = *useJSON
	ins := &fargo.Instance{
		InstanceId:       *id,
		HostName:         *host,
		App:              strings.ToUpper(*app),
		IPAddr:           *host,
		VipAddress:       strings.ToLower(*app),
		SecureVipAddress: strings.ToLower(*app),
		Status:           fargo.UP,
		Port:             *port,
		PortEnabled:      true,
		SecurePort:       443,
		HomePageUrl:      fmt.Sprintf("http://%s:%d/", *host, *port),
		StatusPageUrl:    fmt.Sprintf("http://%s:%d/stats", *host, *port),
		HealthCheckUrl:   fmt.Sprintf("http://%s:%d/stats", *host, *port),
		DataCenterInfo:   fargo.DataCenterInfo{Name: fargo.MyOwn},
		LeaseInfo:        fargo.LeaseInfo{RenewalIntervalInSecs: 1, DurationInSecs: 3},
	}

	listener, err := net.Listen("tcp", fmt.Sprintf("%s:%d", *host, *port))
	if err != nil {
		fmt.Fprintln(os.Stderr, "failed to listen:", err)
		os.Exit(1)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/hello", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, *id) })
	mux.HandleFunc("/stats", func(w http.ResponseWriter, _ *http.Request) {
		stats.mu.Lock()
		defer stats.mu.Unlock()
		out := map[string]any{
			"app": ins.App, "instanceId": *id, "codec": map[bool]string{true: "json", false: "xml"}[*useJSON],
			"transport":           "fargo v1.4.0",
			"fullFetches":         stats.http["fullFetch"],
			"deltaFetches":        stats.http["deltaFetch.200"],
			"deltaRefused":        stats.http["deltaFetch"] - stats.http["deltaFetch.200"],
			"reconcileMismatches": stats.mismatches,
			"registrations":       stats.http["register.204"],
			"heartbeatsOk":        stats.http["heartbeat.200"],
			"cancels":             stats.http["cancel.200"],
			"remoteStatus":        stats.remote,
			"lastServerHashCode":  stats.lastHash,
			"lastLocalHashCode":   stats.lastLocal,
			"http":                stats.http,
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	})
	mux.HandleFunc("/seen-all/", func(w http.ResponseWriter, r *http.Request) {
		name := strings.ToUpper(strings.TrimPrefix(r.URL.Path, "/seen-all/"))
		stats.mu.Lock()
		list := stats.seen[name]
		stats.mu.Unlock()
		if list == nil {
			list = []map[string]string{}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(list)
	})
	go func() { _ = http.Serve(listener, mux) }()

	if err := conn.RegisterInstance(ins); err != nil {
		fmt.Fprintln(os.Stderr, "register failed:", err)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	tick := time.NewTicker(*interval)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			if err := conn.DeregisterInstance(ins); err != nil {
				fmt.Fprintln(os.Stderr, "deregister failed:", err)
				os.Exit(1)
			}
			fmt.Println("deregistered")
			return
		case <-tick.C:
		}
		if err := conn.HeartBeatInstance(ins); err != nil {
			// fargo reports a 404 as an error; a real client registers again.
			if code, ok := fargo.HTTPResponseStatusCode(err); ok && code == http.StatusNotFound {
				// RegisterInstance would GET the instance first and stop when it exists (it
				// does, UNKNOWN, after its override was deleted): register unconditionally.
				ins.Status = fargo.UP
				if err := conn.ReregisterInstance(ins); err != nil {
					fmt.Fprintln(os.Stderr, "re-register failed:", err)
				}
			} else {
				fmt.Fprintln(os.Stderr, "heartbeat failed:", err)
			}
		}
		apps, err := conn.GetApps()
		if err != nil {
			fmt.Fprintln(os.Stderr, "fetch failed:", err)
			continue
		}
		local := reconcileHash(apps)
		seen := map[string][]map[string]string{}
		remote := ""
		for name, a := range apps {
			for _, i := range a.Instances {
				seen[name] = append(seen[name], map[string]string{"id": i.InstanceId, "status": string(i.Status)})
				if i.InstanceId == *id {
					remote = string(i.Status)
				}
			}
		}
		stats.mu.Lock()
		if stats.lastHash != "" && stats.lastHash != local {
			stats.mismatches++
			fmt.Fprintf(os.Stderr, "hash-code mismatch: server %s, decoded %s\n", stats.lastHash, local)
		}
		stats.lastLocal = local
		stats.seen = seen
		stats.remote = remote
		stats.mu.Unlock()
	}
}
