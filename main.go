// Command sandbox serves the local sandbox of the Shipment Tracking and Imported Orders API.
//
// main.go is the process and the path of a request through the server, in the order a
// request meets it: the route table, then the clean-path check, the route, the checks in
// the contract's order, the body, the handlers, writing the answer and the log line; then
// what needs no key. What one operation needs lives with it. Last, the conformance kit (go
// run . check): its command, the catalogue of its rules and their run, its rules of HTTP
// itself, and its reports; each other rule lives beside what it checks, on the kit's floor
// in errors.go. Its sections, each under a banner (grep '^// =====' *.go lists the sections
// of every file):
//
//   - The process: flags and environment
//   - The process: hosts and origins
//   - The process: loading, serving and the way out
//   - The process: the collector
//   - The server and its route table
//   - Every request: a clean path, its route, its call, a panic made a 500
//   - Browsers: CORS
//   - The checks, in their order: declared size, key, live environment, rate limit, scope
//   - Prefer: a simulated answer, a delay, an instant of one's own
//   - Faults for clients that cannot send a header
//   - The body: read once, up to its cap
//   - Writes: Idempotency-Key, and the answers stored under it
//   - The handlers: the four operations and the test helpers
//   - Writing an answer: a problem, and the journal's entry
//   - The access log
//   - What needs no key: health, the document, and what no route serves
//   - The landing page
//   - Conformance: the command, its flags and its run
//   - Conformance: the catalogue and the run
//   - Conformance: every answer, the methods and the body
//   - Conformance: the reports
package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	_ "embed"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"html"
	"html/template"
	"io"
	"log/slog"
	"maps"
	"math"
	"math/bits"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode/utf8"
	"unsafe"
)

//go:embed dataset.json
var defaultDataset []byte

//go:embed openapi.json
var openAPIDocument []byte

// defaultBaseURL is the base URL of `go run .`, as the OpenAPI document states it.
const defaultBaseURL = "http://127.0.0.1:8080/v1"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	if len(os.Args) > 1 && os.Args[1] == "check" { // the conformance kit
		status := runCheck(ctx, os.Args[2:], os.Getenv, os.Stdout, os.Stderr)
		stop()
		os.Exit(status)
	}
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr, boundHeapGrowth)
	stop()
	if err != nil {
		// run has left finalLineWait of its bound for this line.
		errs := newConsole(os.Stderr)
		errs.say("sandbox: " + err.Error() + "\n")
		errs.close(time.Now().Add(finalLineWait))
		os.Exit(1)
	}
}

// ===== The process: flags and environment =====

// What run is told, by flags and by the environment.

// config is what run is told by flags and environment, plus the connection limits, which
// tests shorten.
type config struct {
	addr         string
	addrName     string // what the user set the address with: -addr, or SANDBOX_ADDR
	dataName     string // and the dataset: -data, or SANDBOX_DATA
	corsOrigin   string // -cors-origin: "" for none
	rate         int
	seedOrders   int
	dataFile     string
	cursorSecret string
	clock        *time.Time // -clock: every tenant's clock starts frozen there
	faults       *faultPlan // -faults: nil for none
	journal      int        // -journal: the entries kept per tenant, 0 for none

	readHeaderTimeout time.Duration
	readTimeout       time.Duration
	writeTimeout      time.Duration
	idleTimeout       time.Duration
	drainTimeout      time.Duration // how long after a signal in-flight requests may take to finish
	shutdownTimeout   time.Duration // how long after a signal while serving the process has exited
	loadStopTimeout   time.Duration // how long after a signal while loading the process has exited
	maxHeaderBytes    int
	logFlushInterval  time.Duration
}

func defaultConfig() config {
	return config{
		addr:              "127.0.0.1:8080",
		rate:              25,
		journal:           defaultJournal,
		readHeaderTimeout: 10 * time.Second,
		// The longest request reads a 256 KiB body; the longest answer waits out a
		// Prefer delay of 10 s first.
		readTimeout:  30 * time.Second,
		writeTimeout: 30 * time.Second,
		// Between requests net/http waits under IdleTimeout for the next request's first
		// four bytes, then starts ReadHeaderTimeout afresh: together they bound how long
		// headers that stall may take from their first byte, 30 s.
		idleTimeout:      20 * time.Second,
		drainTimeout:     10 * time.Second,
		shutdownTimeout:  15 * time.Second,
		loadStopTimeout:  2 * time.Second,
		maxHeaderBytes:   64 << 10,
		logFlushInterval: 200 * time.Millisecond,
	}
}

// parseConfig reads the flags, then SANDBOX_<NAME> for each flag not given. Errors name
// the flag or variable at fault.
func parseConfig(args []string, getenv func(string) string, usage io.Writer) (config, error) {
	cfg := defaultConfig()
	fs := flag.NewFlagSet("sandbox", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&cfg.addr, "addr", cfg.addr, "listen `address`")
	fs.Func("rate", "requests per second per key, burst of one second's worth; 0 disables (default 25)", wholeNumber(&cfg.rate, maxRate))
	fs.Func("seed-orders", "add `N` generated orders to acct_sandbox/test (default 0)", wholeNumber(&cfg.seedOrders, maxSeedOrders))
	fs.StringVar(&cfg.dataFile, "data", "", "JSON dataset `file` replacing the embedded default")
	fs.StringVar(&cfg.cursorSecret, "cursor-secret", "", "HMAC `key` for pagination cursors (default random at each start)")
	fs.Func("clock", "start with every tenant's sandbox clock frozen at this RFC 3339 `instant` (default: the clocks follow the wall clock)", func(s string) error {
		at, err := parseTimestamp(s)
		if err != nil {
			return errors.New("want an RFC 3339 timestamp with an offset, such as 2026-03-29T01:00:00Z")
		}
		cfg.clock = &at
		return nil
	})
	fs.Func("faults", "fail a `SPEC` share of the operations' requests that name no Prefer code: rate=R (0 to 1, required),codes=C|C (from 429, 500, 502, 503; default 503),seed=S (default 1), such as rate=0.05,codes=503|429,seed=7 (default: none)", func(v string) (err error) {
		cfg.faults, err = parseFaults(v)
		return err
	})
	fs.Func("journal", "keep the last `N` requests of each account and environment (0 to 100000; 0 turns the journal off) (default 1000)", wholeNumber(&cfg.journal, maxJournal))
	fs.Func("cors-origin", "answer browsers of this `origin` (scheme://host[:port], or *) with CORS headers (default: none)", func(s string) error {
		if s != "*" && !validOrigin(s) {
			return errors.New("want one origin such as http://localhost:3000, or *")
		}
		cfg.corsOrigin = s
		return nil
	})
	given, err := parseFlags(fs, args, usage, "Usage: sandbox [flags]; each flag falls back to SANDBOX_<NAME> (e.g. SANDBOX_SEED_ORDERS).", "the sandbox", "-h")
	if err != nil {
		return cfg, err
	}
	cfg.addrName, cfg.dataName = "-addr", "-data"
	if !given["addr"] && getenv("SANDBOX_ADDR") != "" {
		cfg.addrName = "SANDBOX_ADDR"
	}
	if !given["data"] && getenv("SANDBOX_DATA") != "" {
		cfg.dataName = "SANDBOX_DATA"
	}
	return cfg, fallBack(fs, given, getenv, "SANDBOX_")
}

// parseFlags parses args into fs, a command's flags, and returns the flags given: -h prints
// intro and the flags to usage (flag.ErrHelp); an unknown flag or an argument says where
// the flags are listed (help), naming the command (who).
func parseFlags(fs *flag.FlagSet, args []string, usage io.Writer, intro, who, help string) (map[string]bool, error) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(usage, intro)
			fs.SetOutput(usage)
			fs.PrintDefaults()
			return nil, err
		}
		if strings.HasPrefix(err.Error(), "flag provided but not defined") {
			return nil, fmt.Errorf("%w (see %s for the flags)", err, help)
		}
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q: %s takes flags only (see %s)", fs.Arg(0), who, help)
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	return given, nil
}

// fallBack sets each flag not given from its variable, prefix and its NAME (SANDBOX_NAME,
// SANDBOX_CHECK_NAME); a bad value names the variable.
func fallBack(fs *flag.FlagSet, given map[string]bool, getenv func(string) string, prefix string) error {
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		name := prefix + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		v := getenv(name)
		if err != nil || given[f.Name] || v == "" {
			return
		}
		if e := fs.Set(f.Name, v); e != nil {
			err = fmt.Errorf("invalid value %q for %s (the fallback of -%s): %v", v, name, f.Name, e)
		}
	})
	return err
}

// wholeNumber is a flag's parser of a whole number from 0 to most.
func wholeNumber(dst *int, most int) func(string) error {
	return func(s string) error {
		n, ok := parseWhole(s, most)
		if !ok {
			return fmt.Errorf("want a whole number from 0 to %d", most)
		}
		*dst = n
		return nil
	}
}

// ===== The process: hosts and origins =====

// How a browser or a client names the sandbox: a host (a lower-case DNS name, an IPv4
// address, or a bracketed IPv6 address) and an optional port, 1 to 65535.

// validOrigin reports whether s is one web origin as a browser writes it in Origin:
// http or https, a valid lower-case host, and no port the scheme has by default.
func validOrigin(s string) bool {
	scheme, hostPort, ok := strings.Cut(s, "://")
	if !ok || scheme != "http" && scheme != "https" || s != strings.ToLower(s) {
		return false
	}
	_, port, ok := splitHostPort(hostPort)
	return ok && !(scheme == "http" && port == "80" || scheme == "https" && port == "443")
}

// splitHostPort splits a valid host[:port] (lower-case); ok is false for anything else.
func splitHostPort(s string) (host, port string, ok bool) {
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return "", "", false
		}
		host, port = s[:end+1], strings.TrimPrefix(s[end+1:], ":")
		if len(s) > end+1 && s[end+1] != ':' {
			return "", "", false
		}
		ip, err := netip.ParseAddr(host[1:end])
		ok = err == nil && ip.Is6() && ip.Zone() == "" && validPort(port, len(s) > end+1)
		return host, port, ok
	}
	host, port, hasPort := strings.Cut(s, ":")
	return host, port, validHostName(host) && validPort(port, hasPort)
}

// validPort reports whether port is 1 to 65535 without leading zeros, or absent (given false).
func validPort(port string, given bool) bool {
	if !given {
		return true
	}
	n, ok := parseWhole(port, 65535)
	return ok && n > 0 && port[0] != '0'
}

// validHostName reports whether h is a lower-case DNS name (labels of letters, digits and
// inner hyphens, the last not all digits, no trailing dot) or an IPv4 address (four decimal
// octets, no leading zeros).
func validHostName(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	labels := strings.Split(h, ".")
	if last := labels[len(labels)-1]; last != "" && strings.Trim(last, "0123456789") == "" {
		ip, err := netip.ParseAddr(h)
		return err == nil && ip.Is4()
	}
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' || strings.Trim(l, "abcdefghijklmnopqrstuvwxyz0123456789-") != "" {
			return false
		}
	}
	return true
}

// originOf is the origin a request named the sandbox by: http:// and its Host, lower-cased,
// when that is a valid host[:port]; else fallback, the banner's.
func originOf(r *http.Request, fallback string) string {
	host := strings.ToLower(r.Host)
	if _, _, ok := splitHostPort(host); ok {
		return "http://" + host
	}
	return fallback
}

// namesLoopback reports whether a valid host names this machine's loopback: localhost,
// 127.0.0.0/8 or [::1].
func namesLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(strings.Trim(host, "[]"))
	return err == nil && ip.IsLoopback()
}

// ===== The process: loading, serving and the way out =====

// run: load the dataset, serve it, and stop within a deadline from the signal.

// run is the whole program: it returns when ctx is cancelled and in-flight requests have
// finished, or when start-up fails. Once ctx is cancelled (a signal) it returns within the
// bound that applies, less twice finalLineWait, whatever its outputs do:
// cfg.loadStopTimeout while loading, cfg.shutdownTimeout once serving. tuneHeap, when
// given, is called once the dataset is loaded, and what it returns when run ends: the
// collector's setting is the process's, so it is the caller's to make.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, tuneHeap heapTuner) error {
	cfg, err := parseConfig(args, getenv, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	stop := watchStop(ctx)
	out := newConsole(stdout)
	logs := newLogBuffer(stderr, cfg.logFlushInterval)
	bound, err := loadAndServe(ctx, cfg, getenv, tuneHeap, stop, out, logs)
	// Every way out writes what waits, but only until the bound from the signal (from
	// now, without one), less what main's own last line may take and as much again for
	// a machine whose cores are all busy to schedule the way out.
	deadline := stop.deadline(bound - 2*finalLineWait)
	if !out.close(deadline) && err == nil {
		err = errors.New("stdout stopped reading: the lines not written by the end were lost")
	}
	if lerr := logs.closeWithin(time.Until(deadline)); err == nil {
		err = lerr
	}
	return err
}

// loadAndServe loads the dataset and serves it until ctx is cancelled. It returns the bound
// that applies to the way out: cfg.loadStopTimeout until it serves, then
// cfg.shutdownTimeout.
func loadAndServe(ctx context.Context, cfg config, getenv func(string) string, tuneHeap heapTuner, stop *stopSignal, out *console, logs *logBuffer) (time.Duration, error) {
	logger := slog.New(slog.NewJSONHandler(logs, nil))
	// The start instant: -clock as given, else the wall clock read once, to the second.
	start := time.Now().UTC().Truncate(time.Second)
	if cfg.clock != nil {
		start = *cfg.clock
	}
	sb, err := loadUnlessStopped(ctx, func() (*sandbox, error) { return loadConfigured(cfg, start, out, logger) })
	if err != nil {
		return cfg.loadStopTimeout, err
	}
	if tuneHeap != nil {
		defer tuneHeap(getenv)()
	}
	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return cfg.loadStopTimeout, listenError(cfg, err)
	}
	base := baseURL(ln.Addr())
	stopping := make(chan struct{})
	srv, err := newServer(sb, serverOptions{rate: cfg.rate, cursorSecret: cfg.cursorSecret, baseURL: base, log: logger, access: logs,
		stopping: stopping, corsOrigin: cfg.corsOrigin, loopback: isLoopback(ln.Addr()), faults: cfg.faults, journal: cfg.journal})
	if err != nil {
		ln.Close()
		return cfg.loadStopTimeout, err
	}
	exposed := exposure(ln.Addr(), cfg.addrName, cfg.addr)
	if cfg.clock != nil {
		for _, t := range sb.tenants.list {
			t.clock.freeze(*cfg.clock)
		}
		exposed += "Every sandbox clock is frozen at " + formatTimestamp(*cfg.clock) + " (-clock); POST /v1/test_helpers/clock moves one.\n"
	}
	if cfg.faults != nil {
		exposed += "Faults are on: " + cfg.faults.describe() + "\n"
	}
	out.say(banner(base, sb.keyLines, exposed, isLoopback(ln.Addr())))
	logger.Info("serving", "base_url", base, "orders", sb.orderCount, "shipments", sb.shipmentCount)
	err = serve(ctx, newHTTPServer(cfg, srv.handler(), logger), ln, func() {
		out.say(fmt.Sprintf("Shutting down: requests in flight may take up to %v to finish.\n", cfg.drainTimeout))
		close(stopping)
	}, stop, cfg.drainTimeout)
	if err == nil {
		out.say(fmt.Sprintf("Stopped: %d requests drained.\n", srv.drained.Load()))
	}
	return cfg.shutdownTimeout, err
}

// listenError says why the sandbox cannot listen where the configuration says, naming what
// the user set; an address in use also says how to go on.
func listenError(cfg config, err error) error {
	if !errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("%s %s: %w", cfg.addrName, cfg.addr, err)
	}
	next := nextAddress(cfg.addr)
	other := "pass another -addr, such as -addr " + next
	if cfg.addrName == "SANDBOX_ADDR" {
		other = "set SANDBOX_ADDR to another address, such as " + next
	}
	return fmt.Errorf("%s %s: %w: another process listens there (another sandbox, perhaps): stop it, or %s", cfg.addrName, cfg.addr, err, other)
}

// nextAddress is the address of the port after addr's on its host (the one before, for
// 65535): what an address in use suggests instead.
func nextAddress(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	n, perr := strconv.Atoi(port)
	if err != nil || perr != nil || n < 1 || n > 65535 {
		return "127.0.0.1:8081"
	}
	if n == 65535 {
		return net.JoinHostPort(host, "65534")
	}
	return net.JoinHostPort(host, strconv.Itoa(n+1))
}

// loadConfigured loads the dataset the configuration names: the embedded default, or the
// file -data names, which is opened and read here, under loading's bound from a signal.
func loadConfigured(cfg config, start time.Time, out *console, log *slog.Logger) (*sandbox, error) {
	name, src := defaultDatasetName, io.ReadCloser(io.NopCloser(bytes.NewReader(defaultDataset)))
	out.say(loadingLine(cmp.Or(cfg.dataFile, name), cfg.seedOrders))
	if cfg.dataFile != "" {
		name = cfg.dataFile
		var err error
		var de *datasetError
		if src, err = openDataset(cfg.dataFile); errors.As(err, &de) {
			return nil, err
		} else if err != nil {
			return nil, fmt.Errorf("%s: %w", cfg.dataName, err)
		}
	}
	defer src.Close()
	return loadDataset(name, src, cfg.seedOrders, start, log)
}

// loadingLine says what start-up is doing while a large dataset loads: the embedded
// default dataset, or the file -data names.
func loadingLine(name string, seed int) string {
	if name == defaultDatasetName {
		name = "the " + name
	}
	if seed > 0 {
		return fmt.Sprintf("Loading %s and %d generated orders...\n", name, seed)
	}
	return fmt.Sprintf("Loading %s...\n", name)
}

// loadUnlessStopped loads, unless ctx is cancelled first: a signal during a long load
// stops the process at once rather than after the load.
func loadUnlessStopped(ctx context.Context, load func() (*sandbox, error)) (*sandbox, error) {
	type loaded struct {
		sb  *sandbox
		err error
	}
	done := make(chan loaded, 1)
	go func() {
		sb, err := load()
		done <- loaded{sb, err}
	}()
	select {
	case l := <-done:
		return l.sb, l.err
	case <-ctx.Done():
		return nil, errors.New("stopped while loading the dataset: nothing was served")
	}
}

// sandbox is a loaded dataset.
type sandbox struct {
	start         time.Time // the start instant: events with after happen after it
	tenants       tenants
	keys          keyring
	keyLines      []keyLine // for the banner
	templates     map[string]*sandboxTemplate
	orderCount    int
	shipmentCount int
}

// seedTenant receives the -seed-orders orders.
var seedTenant = tenantID{"acct_sandbox", "test"}

// datasetFile is a dataset as read: its four lists of records, each decoded by its owner.
type datasetFile struct {
	accounts  []accountRecord
	keys      []keyRecord
	shipments []shipmentRecord
	orders    *orderRecords
}

var datasetFields = []string{"accounts", "keys", "shipments", "orders"}

// defaultDatasetName names the embedded default dataset.
const defaultDatasetName = "embedded default dataset"

// maxDatasetBytes is the most a dataset may hold: a file over it, or a stream that passes
// it, is refused.
const maxDatasetBytes = 2 << 30

// loadDataset reads, checks and loads a dataset from src, refusing it with the file and
// the JSON path of a fault, and logs, per shipment, the raw events it left out or showed
// once (the default dataset's fixtures leave some out on purpose: no warning then). Events
// and instants relative to the start instant are placed after start.
func loadDataset(file string, src io.Reader, seed int, start time.Time, log *slog.Logger) (*sandbox, error) {
	sb, noted, err := decodeDataset(src, seed, start)
	var de *datasetError
	if errors.As(err, &de) {
		de.file = file
	}
	if err != nil {
		return nil, err
	}
	dropped, msg := slog.LevelWarn, "dataset: raw events dropped: timestamp not RFC 3339 with an offset"
	if file == defaultDatasetName {
		dropped, msg = slog.LevelInfo, "dataset: raw events dropped, as this fixture means to show: timestamp not RFC 3339 with an offset"
	}
	for _, s := range noted {
		if s.dropped > 0 {
			log.Log(context.Background(), dropped, msg, "shipment", s.id, "tenant", s.tenant.String(), "dropped", s.dropped)
		}
		if s.duplicates > 0 {
			log.Info("dataset: duplicate events suppressed", "shipment", s.id, "tenant", s.tenant.String(), "duplicates", s.duplicates)
		}
	}
	return sb, nil
}

// decodeDataset reads a dataset in one pass (its JSON faults are found in the order
// written), then loads its records in the order they depend on each other, whatever order
// the file gives its lists: accounts, keys (auth.go), orders (orders.go), shipments
// (tracking.go) with the links they make to orders, then the seeded orders; last, each
// tenant's indexes are built.
func decodeDataset(src io.Reader, seed int, start time.Time) (*sandbox, []loadedShipment, error) {
	ds, err := readDatasetFile(src, maxDatasetBytes)
	if err != nil {
		return nil, nil, err
	}
	ld := newLoader(start)
	var noted []loadedShipment
	err = ld.addAccounts(ds.accounts)
	if err == nil {
		err = ld.loadKeys(ds.keys)
	}
	if err == nil {
		err = ld.loadOrders(ds.orders, nil)
	}
	if err == nil {
		noted, err = ld.loadShipments(ds.shipments, nil)
	}
	if err == nil && seed > 0 {
		err = addSeedOrders(&ld.tenants, seed)
	}
	sb := &sandbox{start: start, tenants: ld.tenants, keys: ld.keys, keyLines: ld.keyLines}
	if err == nil {
		sb.templates = ld.keepTemplates(ds, seed)
		sb.orderCount, sb.shipmentCount, err = ld.build()
	}
	if err != nil {
		return nil, nil, err
	}
	return sb, noted, nil
}

// readDatasetFile reads a dataset's JSON from src, at most limit bytes.
func readDatasetFile(src io.Reader, limit int64) (*datasetFile, error) {
	ds := &datasetFile{orders: newOrderRecords()}
	d := newJSONReader(src, limit)
	err := d.document(datasetFields, func(name string) error {
		path := "$." + name
		switch name {
		case "accounts":
			return readList(d, path, &ds.accounts)
		case "keys":
			return readList(d, path, &ds.keys)
		case "shipments":
			return readList(d, path, &ds.shipments)
		case "orders":
			return ds.orders.readOrders(d, path, &orderShape)
		}
		return nil
	})
	return ds, err
}

// openDataset opens a -data file, or refuses one whose size is known to be over
// maxDatasetBytes. Whatever it is (a file, a FIFO, a device), it is read as a stream:
// opening and reading it may block, which loading bounds from a signal.
func openDataset(name string) (io.ReadCloser, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	if info, err := f.Stat(); err == nil && info.Mode().IsRegular() && info.Size() > maxDatasetBytes {
		f.Close()
		return nil, &datasetError{file: name, path: "$", reason: fmt.Sprintf("the file is %d bytes: a dataset is at most %d bytes (%s)", info.Size(), maxDatasetBytes, byteSize(maxDatasetBytes))}
	}
	return f, nil
}

// addSeedOrders adds n generated orders to acct_sandbox/test.
func addSeedOrders(ts *tenants, n int) error {
	t := ts.byID[seedTenant]
	if t == nil {
		return fmt.Errorf("-seed-orders: the dataset has no account %s with environment %s to seed", seedTenant.account, seedTenant.environment)
	}
	return t.current().orders.seedOrders(n)
}

// banner is the start-up banner, written in one write so that a reader of stdout sees it
// whole or not at all; notes are lines of its own (where it listens, a frozen clock). The
// page at / shows the keys only while the sandbox listens on loopback, and the banner says
// only what the page shows.
func banner(base string, keys []keyLine, notes string, pageShowsKeys bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Shipping API sandbox (v1, developer preview): local sandbox, no carrier or marketplace is called.\n")
	origin := strings.TrimSuffix(base, "/v1")
	shows := "the keys, the fixtures"
	if !pageShowsKeys { // listening beyond loopback: the page shows no key (the list below does)
		shows = "the fixtures"
	}
	fmt.Fprintf(&b, "In a browser: %s/ shows %s and what moves on the sandbox clock.\n", origin, shows)
	fmt.Fprintf(&b, "Base URL: %s for API clients; every operation is described in %s/openapi.json\n", base, base)
	b.WriteString(notes)
	fmt.Fprintf(&b, "API keys (send as Authorization: Bearer <key>):\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	for _, k := range keys {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", k.key, k.tenant.String(), k.scopes, k.state)
	}
	tw.Flush()
	if len(keys) > 0 {
		fmt.Fprintf(&b, "Try: curl -s -H 'Authorization: Bearer %s' %s/orders\n", keys[0].key, base)
	}
	return b.String()
}

// baseURL is the URL clients use: an unspecified listen host is reached on loopback.
func baseURL(addr net.Addr) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return "http://" + addr.String() + "/v1"
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/v1"
}

// isLoopback reports whether addr is a loopback address only: then the landing page may
// show the sandbox keys.
func isLoopback(addr net.Addr) bool {
	host, _, _ := net.SplitHostPort(addr.String())
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// exposure is the banner's line for an address other machines can reach, or "".
func exposure(addr net.Addr, name, value string) string {
	host, _, _ := net.SplitHostPort(addr.String())
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return fmt.Sprintf("Listening on every network interface (%s %s): other machines can reach this sandbox. The landing page does not show the keys.\n", name, value)
	}
	if !isLoopback(addr) {
		return fmt.Sprintf("Listening on %s (%s %s), not loopback: other machines may reach this sandbox. The landing page does not show the keys.\n", host, name, value)
	}
	return ""
}

// newHTTPServer sets the connection limits: a client that is slow to send its headers is
// cut off after ReadHeaderTimeout, and no request or answer holds a connection for long.
// What net/http itself reports (accept errors, say) goes to the service's log as warnings.
func newHTTPServer(cfg config, h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: cfg.readHeaderTimeout,
		ReadTimeout:       cfg.readTimeout,
		WriteTimeout:      cfg.writeTimeout,
		IdleTimeout:       cfg.idleTimeout,
		MaxHeaderBytes:    cfg.maxHeaderBytes,
		// "OPTIONS *" is answered by the handler too, as a JSON 404, not by net/http.
		DisableGeneralOptionsHandler: true,
		ErrorLog:                     slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// serve serves until ctx is cancelled, then stops accepting, tells waiting requests to
// stop waiting, and lets in-flight requests finish within grace of the signal.
func serve(ctx context.Context, hs *http.Server, ln net.Listener, stopping func(), stop *stopSignal, grace time.Duration) error {
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	stopping()
	// ctx is already cancelled: shutting down gets a deadline of its own.
	sctx, cancel := context.WithDeadline(context.Background(), stop.deadline(grace))
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		hs.Close() // past the grace period: cut what is left
		return fmt.Errorf("shutdown: requests still in flight when the drain ended were cut off: %w", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// finalLineWait is how long main's last line (run's error) may wait for stderr: run's
// own waits end twice that before the bound.
const finalLineWait = 500 * time.Millisecond

// stopSignal is when ctx was cancelled: every wait on the way out is a deadline from that
// instant, not a sum of waits.
type stopSignal struct{ at atomic.Pointer[time.Time] }

func watchStop(ctx context.Context) *stopSignal {
	s := &stopSignal{}
	context.AfterFunc(ctx, func() {
		now := time.Now()
		s.at.Store(&now)
	})
	return s
}

// deadline is d after the signal, or after now when there has been none.
func (s *stopSignal) deadline(d time.Duration) time.Time {
	if at := s.at.Load(); at != nil {
		return at.Add(d)
	}
	return time.Now().Add(d)
}

// console writes lines for a person (the banner, the loading and shutdown lines) in order,
// from a goroutine of its own, so that the program never waits for a terminal or pipe
// that has stopped reading, which cannot be given a deadline of its own.
type console struct {
	lines   chan string
	written chan struct{} // closed once every line said is written
}

// consoleBacklog is how many lines may wait for a destination; more are dropped.
const consoleBacklog = 64

func newConsole(w io.Writer) *console {
	c := &console{lines: make(chan string, consoleBacklog), written: make(chan struct{})}
	go func() {
		defer close(c.written)
		for line := range c.lines {
			w.Write([]byte(line))
		}
	}()
	return c
}

// say queues line, each written whole by one write.
func (c *console) say(line string) {
	select {
	case c.lines <- line:
	default: // the destination is far behind: the line is dropped rather than wait
	}
}

// close waits until every line is written or deadline passes, and reports which.
func (c *console) close(deadline time.Time) bool {
	close(c.lines)
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-c.written:
		return true
	case <-t.C:
		return false
	}
}

// ===== The process: the collector =====

// heapHeadroom is how much the heap may grow past its live data between collections.
const heapHeadroom = 64 << 20

// heapTuner sets the garbage collector for the data loaded, and returns what restores it.
type heapTuner func(getenv func(string) string) (restore func())

// boundHeapGrowth collects what loading left behind, then keeps the process's GC
// percentage such that the heap grows by about heapHeadroom past the live data between
// collections (never by less than 10%), unless GOGC is set: it is set from the live heap
// after loading, and again after every collection, since what is live grows as the sandbox
// serves (journals, stored answers). Set once, from a small dataset's few MiB, it would let
// garbage grow to 17 times a live heap that the journals had grown; with Go's default, the
// heap of a million orders would double under load, and until the first collection every
// request would be served from memory never touched before; a small dataset's heap would
// be collected some 60 times a second under load. It returns the function that restores
// the setting.
func boundHeapGrowth(getenv func(string) string) (restore func()) {
	debug.FreeOSMemory()
	if getenv("GOGC") != "" {
		return func() {}
	}
	var mu sync.Mutex
	stopped := false
	old := debug.SetGCPercent(gcPercent(liveHeap()))
	afterEachGC(func() bool {
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			debug.SetGCPercent(gcPercent(liveHeap()))
		}
		return !stopped
	})
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		debug.SetGCPercent(old)
	}
}

// gcPercent is the GC percentage that lets a heap of live bytes grow by about
// heapHeadroom, at least 10%. A live heap under 4 MiB counts as 4 MiB: the runtime's
// smallest goal is 4 MiB scaled by the percentage.
func gcPercent(live uint64) int {
	return int(max(10, 100*heapHeadroom/max(live, 4<<20)))
}

// liveHeap is the bytes the last collection found live (runtime/metrics: no stop of the world).
func liveHeap() uint64 {
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(sample)
	if sample[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return sample[0].Value.Uint64()
}

// gcSentinel is garbage made to be found: its finalizer runs once the collection that found
// it is done. It holds a pointer so that it is not one of the tiny objects the allocator
// packs together, whose finalizers may wait on their neighbours.
type gcSentinel struct{ _ *byte }

// afterEachGC calls each after every collection, on the finalizers' goroutine, until it
// returns false.
func afterEachGC(each func() bool) {
	runtime.SetFinalizer(&gcSentinel{}, func(*gcSentinel) {
		if each() {
			afterEachGC(each)
		}
	})
}

// ===== The server and its route table =====

// The server: the dataset's operations, one route table, and the handler that serves it;
// each route's checks are wrappers chained in the contract's order, each answering or
// handing the request on with what it found in the request's call.

// serverOptions are the server's settings besides its data.
type serverOptions struct {
	rate         int
	cursorSecret string
	baseURL      string
	log          *slog.Logger     // start-up notes, panics, net/http's own reports
	access       *logBuffer       // the access log: one line per request; nil for none
	stopping     <-chan struct{}  // closed when the server starts shutting down
	corsOrigin   string           // "": no CORS headers
	faults       *faultPlan       // nil: no faults
	loopback     bool             // listening on loopback only: the landing page shows the keys
	now          func() time.Time // the wall clock: tenants' clocks follow it, and the rate limit uses it
	journal      int              // the entries each tenant's journal keeps; 0: none
	journalBytes int64            // what all journals may hold together; 0: maxJournalBytes
}

// server is the service over one loaded dataset.
type server struct {
	// drained counts the requests that finished after shutdown began, for the stopped
	// line. Only those write it: a counter every request wrote would bounce its cache line
	// between the cores (compare.sh shows it).
	drained   atomic.Int64
	cors      *cors       // nil: no CORS headers
	faults    *faultPlan  // nil: -faults is off
	book      *tenantBook // the bounds every tenant's bookkeeping shares, and the sandboxes
	landing   *landing
	clocks    clockHelpers
	keys      keyFinder
	templates map[string]*sandboxTemplate // the dataset's accounts a sandbox may copy
	rate      *rateLimit                  // nil: no rate limit
	cursors   *cursorSigner
	pages     sync.Pool // of *[]byte: the buffers pages are assembled in
	now       func() time.Time
	log       *slog.Logger
	access    *logBuffer
	stopping  <-chan struct{}
	openAPI   *openAPIDoc
	origin    string // the banner's origin: the address a request names, when its Host does not
	health    []byte
}

func newServer(sb *sandbox, o serverOptions) (*server, error) {
	if o.now == nil {
		o.now = time.Now
	}
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	if o.baseURL == "" {
		o.baseURL = defaultBaseURL
	}
	secret := []byte(o.cursorSecret)
	if len(secret) == 0 {
		secret = make([]byte, 32)
		rand.Read(secret)
	}
	doc, err := newOpenAPIDoc()
	if err != nil {
		return nil, err
	}
	var c *cors
	if o.corsOrigin != "" {
		c = &cors{origin: o.corsOrigin}
	}
	if o.journalBytes == 0 {
		o.journalBytes = maxJournalBytes
	}
	srv := &server{
		cors:      c,
		faults:    o.faults,
		book:      newTenantBook(sb.tenants.list, o.journal, o.journalBytes),
		landing:   newLanding(sb, o.loopback, o.faults),
		clocks:    clockHelpers{wall: o.now},
		templates: sb.templates,
		rate:      newRateLimit(o.rate, o.now()),
		cursors:   newCursorSigner(secret),
		pages:     sync.Pool{New: func() any { return new([]byte) }},
		now:       o.now,
		log:       o.log,
		access:    o.access,
		stopping:  o.stopping,
		openAPI:   doc,
		origin:    strings.TrimSuffix(o.baseURL, "/v1"),
		health:    []byte(`{"status":"ok"}`),
	}
	srv.keys = keyFinder{dataset: sb.keys, sandboxes: srv.book, wall: o.now}
	return srv, nil
}

// route is one method and path the server answers, as a ServeMux pattern.
type route struct {
	pattern string
	handler callHandler
}

// routes lists every route the server answers. A GET pattern serves HEAD too.
func (s *server) routes() []route {
	return []route{
		{"GET /v1/shipments/{id}/tracking", s.operation(scopeTrackingRead, noParams(trackingByID))},
		{"GET /v1/tracking/{tracking_number}", s.operation(scopeTrackingRead, noParams(trackingByNumber))},
		{"GET /v1/orders", s.operation(scopeOrdersRead, s.listOrders)},
		{"GET /v1/orders/{id}", s.operation(scopeOrdersRead, noParams(getOrder))},
		{"GET /v1/test_helpers/clock", s.testHelper(codeAndDelay, s.getClock)},
		{"POST /v1/test_helpers/clock", s.testHelper(codeAndDelay, s.setClock)},
		{"GET /v1/test_helpers/timeline", s.testHelper(withClock, getTimeline)},
		{"GET /v1/test_helpers/requests", s.journalReader(s.readRequests)},
		{"GET /v1/test_helpers/findings", s.journalReader(s.readFindings)},
		{"POST /v1/test_helpers/sandboxes", s.write(codeAndDelay, s.makeSandbox)},
		{"DELETE /v1/test_helpers/sandboxes/{account}", s.testHelper(codeAndDelay, s.deleteSandbox)},
		{"POST /v1/test_helpers/shipments", s.write(withClock, s.createShipment)},
		{"GET /v1/openapi.json", s.keyless(s.serveOpenAPI)},
		{"GET /v1/healthz", s.keyless(s.serveHealth)},
		{"GET /healthz", s.keyless(s.serveHealth)}, // also outside the base URL, for probes that know none
		{"GET /{$}", s.keyless(s.landingPage)},
	}
}

// handler is the whole service: each route of the table with its wrappers, a 405 with the
// path's Allow for any other method on a known path, and a 404 for any other path. extra
// routes are for tests.
func (s *server) handler(extra ...route) http.Handler {
	mux := http.NewServeMux()
	allow := map[string][]string{} // path -> its methods, in the order of the table
	var paths []string
	for _, rt := range append(s.routes(), extra...) {
		method, path, _ := strings.Cut(rt.pattern, " ")
		mux.Handle(rt.pattern, s.serveRoute(path, rt.handler))
		if allow[path] == nil {
			paths = append(paths, path)
		}
		allow[path] = append(allow[path], method)
		if method == http.MethodGet {
			allow[path] = append(allow[path], http.MethodHead)
		}
	}
	for _, path := range paths {
		h := methodNotAllowed(allow[path], s.cors == nil && path != "/{$}")
		if path != "/{$}" { // the page is no API: no CORS there
			h = s.cors.preflight(allow[path], h)
		}
		mux.Handle(path, s.serveRoute(path, h))
	}
	for _, path := range []string{"/v1", "/v1/{$}"} {
		mux.Handle(path, s.serveRoute(path, s.v1Root))
	}
	mux.Handle("/", s.serveRoute("/", s.routeNotFound))
	return cleanPaths(s.serveRoute("", s.routeNotFound), mux)
}

// operation wraps a v1 operation in the checks of a keyed route, with the key's expiry
// judged by the tenant's clock, then its scope (403) and every Prefer preference; h then
// checks parameters and the resource.
func (s *server) operation(need scope, h keyedHandler) callHandler {
	return s.keyed(h, tenantClock, journaled, requireScope(need), s.simulate(withClock|withFaults))
}

// testHelper wraps a test helper in the checks of a keyed route but the scope (any active
// key of the tenant may use it), with a key's expiry judged by the wall clock, so that a
// tenant can always move its clock back, then the preferences it reads; it takes no query
// parameters.
func (s *server) testHelper(reads preferences, h keyedHandler) callHandler {
	return s.keyed(noParams(h), wallClock, journaled, s.simulate(reads))
}

// journalReader wraps a read of the journal as a test helper, but that it takes its own
// query parameters and is not journaled itself; with the journal off it answers 404.
func (s *server) journalReader(h keyedHandler) callHandler {
	return s.keyed(func(w http.ResponseWriter, r *http.Request, c *call) error {
		if !s.book.journaling() {
			return errJournalOff
		}
		return h(w, r, c)
	}, wallClock, unjournaled, s.simulate(codeAndDelay))
}

// journaling says whether a route's requests are journaled.
type journaling bool

const (
	journaled   journaling = true
	unjournaled journaling = false // the reads of the journal
)

// keyed wraps h in the checks of a route called with a key, in the contract's order: (route
// and method by the mux), declared body size (413), key (401, its expiry by expiry's
// clock), live environment (503), rate limit (429), then the route's own (scope, Prefer),
// then the streamed body size (413).
func (s *server) keyed(h keyedHandler, expiry expiryClock, j journaling, own ...wrapper) callHandler {
	checks := []wrapper{capDeclared, requireKey(&s.keys, s.now, expiry, bool(j) && s.book.journaling()), refuseLive, limitRate(s.rate, s.now)}
	return chain(s.serveKeyed(h), append(append(checks, own...), s.readBody)...)
}

// keyless wraps a route that needs no key: it has only the body's cap.
func (s *server) keyless(h callHandler) callHandler { return chain(h, capDeclared, s.readBody) }

// keyedHandler is the work of a route called with a key, once every check has passed: c
// holds the key, its tenant and the instant the answer is judged at. It writes the answer,
// or returns the error to answer with.
type keyedHandler func(w http.ResponseWriter, r *http.Request, c *call) error

// serveKeyed runs a keyed route's work and answers with the error it returns.
func (s *server) serveKeyed(h keyedHandler) callHandler {
	return func(w http.ResponseWriter, r *http.Request, c *call) {
		if err := h(w, r, c); err != nil {
			s.writeError(w, c, err)
		}
	}
}

// call is one request to the service as its wrappers see it, handed from one to the next:
// its id (in the answer and the log), the key that made it and its tenant's clock once
// requireKey has found one, the instant its resources are judged at, and the status it
// was answered with.
type call struct {
	id        string
	arrived   time.Time // when it arrived, by the machine's clock (as its log line's duration and its journal entry)
	key       *apiKey
	clock     clockReading // the tenant's clock, read once when the key was found
	data      *tenantData  // the tenant's data, read once with its clock: every answer of the request is of this version
	at        time.Time    // what the answer shows is judged at this instant: clock.now, or Prefer's clock
	status    int
	code      code        // the problem's code, if it was answered with one
	simulated simulation  // what answered instead of the route, if anything did
	run       string      // its Prefer run
	prefer    *preference // its Prefer, as read; nil for none
	// A write's: its Idempotency-Key, the answer it wrote (nil until the write is done), and
	// the 502 Prefer asked for, answered once the write is done.
	idempotencyKey string
	written        *storedAnswer
	unconfirmed    *apiError
	write          *writeMark // a write's key and body digest, once its body was read: the journal's too
	bodySize       int64      // the bytes of its body, for the journal; -1 unknown
	body           []byte     // its body, once readBody read it
	shown          showing    // what its answer showed, for the journal
	journal        *apiKey    // the key whose tenant journals it, if it is journaled
	journaled      bool       // its entry is written
}

// callHandler is a handler that is handed the request's call. It is not a
// func(http.Handler) http.Handler: what one check finds (the key, its tenant's clock
// reading, the instant the answer is judged at) is handed to the next as a typed value,
// not recovered from a context by a key or from the ResponseWriter by asserting its type,
// which any wrapper of a demo's (a middleware, a recorder) would break.
type callHandler func(w http.ResponseWriter, r *http.Request, c *call)

// wrapper is one check a request passes on its way to its handler: it answers, or hands
// the request on to next.
type wrapper func(next callHandler) callHandler

// chain wraps h in ws, the first outermost: a request passes them in the order listed.
func chain(h callHandler, ws ...wrapper) callHandler {
	for i := len(ws) - 1; i >= 0; i-- {
		h = ws[i](h)
	}
	return h
}

// ===== Every request: a clean path, its route, its call, a panic made a 500 =====

// cleanPaths answers a path that is not in canonical form (//, /./, /../, and their
// escaped spellings such as /%2e%2e/) with unclean, where ServeMux would answer with a
// redirect, or hand an escaped dot segment to a handler as an id.
func cleanPaths(unclean, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !isCleanPath(r.URL.EscapedPath()) {
			unclean.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// isCleanPath reports whether the escaped path p is in canonical form: it starts with "/"
// and no segment is empty, "." or "..", also escaped (%2e%2e), but for the empty last
// segment after a trailing slash. ServeMux cleans only what it sees unescaped, so an
// escaped dot segment would reach a handler as an id.
func isCleanPath(p string) bool {
	if p == "" || p[0] != '/' {
		return false
	}
	for rest := p[1:]; rest != ""; {
		seg, after, more := strings.Cut(rest, "/")
		if strings.IndexByte(seg, '%') >= 0 {
			if u, err := url.PathUnescape(seg); err == nil {
				seg = u
			}
		}
		if seg == "" || seg == "." || seg == ".." {
			return false
		}
		if !more {
			break
		}
		rest = after
	}
	return true
}

// serveRoute adapts a route's handler to net/http: it gives the request its call and every
// answer its request id and common headers, turns a panic into a 500 that shows no
// internals, and logs one line per request with route, the pattern's path.
func (s *server) serveRoute(route string, next callHandler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w, s: s, r: r, route: route, c: call{id: newRequestID(), arrived: time.Now(), bodySize: -1}}
		h := w.Header()
		h.Set("Request-Id", sw.c.id)
		h.Set("Cache-Control", "no-store")
		h.Set("X-Content-Type-Options", "nosniff")
		if s.cors != nil && s.cors.applies(r.URL.Path) {
			s.cors.allow(h)
		}
		defer s.finish(sw, r.Method, route)
		next(sw, r, &sw.c)
	})
}

// statusWriter is the ResponseWriter a route's handlers write to: it notes the status
// answered in the request's call, for the log, and journals the request once its status
// is known, before its body.
type statusWriter struct {
	http.ResponseWriter
	s     *server
	r     *http.Request
	route string
	c     call
}

func (sw *statusWriter) WriteHeader(status int) {
	if sw.c.status == 0 {
		sw.c.status = status
		sw.s.writeEntry(sw)
	}
	sw.ResponseWriter.WriteHeader(status)
}

func (sw *statusWriter) Write(b []byte) (int, error) {
	if sw.c.status == 0 {
		sw.WriteHeader(http.StatusOK)
	}
	return sw.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's own writer.
func (sw *statusWriter) Unwrap() http.ResponseWriter { return sw.ResponseWriter }

// finish ends every request, also one that panics or is aborted: a panic becomes a 500
// that shows no internals (or, after part of the answer, a cut connection), and the
// request gets its one log line.
func (s *server) finish(sw *statusWriter, method, route string) {
	v := recover()
	// Part of the answer is sent (or the request was aborted): cut the connection rather
	// than let a truncated answer pass for a whole one.
	cut := v == http.ErrAbortHandler || v != nil && sw.c.status != 0
	if v != nil && v != http.ErrAbortHandler {
		s.log.Error("panic", "request_id", sw.c.id, "route", route, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
		if !cut {
			sw.c.fail(sw, errInternal)
		}
	}
	if sw.c.status == statusClientClosedRequest {
		s.writeEntry(sw) // answered with nothing
	}
	end := time.Now()
	s.logRequest(method, route, &sw.c, end, end.Sub(sw.c.arrived))
	select {
	case <-s.stopping:
		s.drained.Add(1)
	default:
	}
	if cut {
		panic(http.ErrAbortHandler)
	}
}

// newRequestID returns "req_" and 20 random base-32 characters (100 bits). The ids
// are for correlation, not secrets, so the runtime's per-thread generator serves.
func newRequestID() string {
	const alphabet = "0123456789abcdefghjkmnpqrstvwxyz"
	var b [24]byte
	copy(b[:], "req_")
	hi, lo := mrand.Uint64(), mrand.Uint64()
	for i := 4; i < 24; i++ {
		b[i] = alphabet[hi&31]
		hi = hi>>5 | lo<<59
		lo >>= 5
	}
	return string(b[:])
}

// ===== Browsers: CORS =====

// With -cors-origin, every answer under /v1 and /healthz carries the CORS headers that let a
// front end of that origin read it, and a preflight on a known path is answered before any
// key is looked at: the first check.

// cors is the -cors-origin setting.
type cors struct {
	origin string // the Access-Control-Allow-Origin value
}

// applies reports whether an answer at path carries the CORS headers: under /v1 and
// /healthz, not on the landing page nor on paths outside the API.
func (c *cors) applies(path string) bool {
	return path == "/healthz" || path == "/v1" || strings.HasPrefix(path, "/v1/")
}

// allow sets the headers every answer of a browser's origin carries.
func (c *cors) allow(h http.Header) {
	h.Set("Access-Control-Allow-Origin", c.origin)
	h.Set("Vary", "Origin")
	h.Set("Access-Control-Expose-Headers", "Request-Id, RateLimit, RateLimit-Policy, Retry-After, Preference-Applied, WWW-Authenticate, Location, Idempotent-Replayed")
}

// preflight answers a CORS preflight (OPTIONS with Origin and
// Access-Control-Request-Method) on a known path with 204 and the path's methods; any
// other request goes to next.
func (c *cors) preflight(methods []string, next callHandler) callHandler {
	if c == nil {
		return next
	}
	allowMethods := strings.Join(methods, ", ")
	return func(w http.ResponseWriter, r *http.Request, c *call) {
		if !isPreflight(r) {
			next(w, r, c)
			return
		}
		h := w.Header()
		h.Set("Access-Control-Allow-Methods", allowMethods)
		if asked := r.Header.Values("Access-Control-Request-Headers"); len(asked) > 0 {
			h.Set("Access-Control-Allow-Headers", strings.Join(asked, ", "))
		}
		h.Set("Access-Control-Max-Age", "600")
		w.WriteHeader(http.StatusNoContent)
	}
}

// isPreflight reports whether r is a CORS preflight: OPTIONS with Origin and
// Access-Control-Request-Method.
func isPreflight(r *http.Request) bool {
	return r.Method == http.MethodOptions && r.Header.Get("Origin") != "" && r.Header.Get("Access-Control-Request-Method") != ""
}

// ===== The checks, in their order: declared size, key, live environment, rate limit, scope =====

// maxBodyBytes is the request body limit: 256 KiB.
const maxBodyBytes = 256 << 10

var errBodyTooLarge = &apiError{code: codeBodyTooLarge, detail: fmt.Sprintf("The request body exceeds %d bytes (%d KiB).", maxBodyBytes, maxBodyBytes>>10)}

// refuseTooLarge answers 413 to a body over the cap and closes the connection: what is
// left of the body is not read.
func refuseTooLarge(w http.ResponseWriter, c *call) {
	w.Header().Set("Connection", "close")
	c.fail(w, errBodyTooLarge)
}

// capDeclared answers 413 to a request that declares a body over maxBodyBytes, before its key
// is looked at, and closes the connection after it.
func capDeclared(next callHandler) callHandler {
	return func(w http.ResponseWriter, r *http.Request, c *call) {
		if r.ContentLength > maxBodyBytes {
			refuseTooLarge(w, c)
			return
		}
		if r.TransferEncoding != nil {
			// net/http drops a Content-Length sent beside Transfer-Encoding before any
			// handler sees it; such a request may be smuggling another (RFC 9112, 6.3),
			// so the connection is closed after any request with a framing of its own.
			w.Header().Set("Connection", "close")
		}
		next(w, r, c)
	}
}

// expiryClock is the clock a route judges a key's expiry by.
type expiryClock uint8

const (
	tenantClock expiryClock = iota // the tenant's clock, as read once: the operations
	wallClock                      // the wall clock: the test helpers, so that a tenant can always move its clock back
)

// requireKey answers 401 unless the request carries an active key, which it hands on with
// its tenant's clock, read once. A key's expiry is judged by that reading or by the wall
// clock, as expiry says. Where journal says, a request that names a key of a test
// environment, whatever its state, is journaled in its tenant.
func requireKey(keys *keyFinder, wall func() time.Time, expiry expiryClock, journal bool) wrapper {
	return func(next callHandler) callHandler {
		return func(w http.ResponseWriter, r *http.Request, c *call) {
			k, fault := keys.authenticate(r.Header)
			if k != nil {
				c.data = k.tenant.current()
				c.clock = k.tenant.clock.read(wall)
				c.at = c.clock.now
				if journal && !k.tenant.live {
					c.journal = k
				}
			}
			if fault == nil {
				judged := c.clock.now
				if expiry == wallClock {
					judged = wall()
				}
				if k.expiredAt(judged) {
					fault = errExpiredKey
				}
			}
			if fault != nil {
				c.fail(w, fault)
				return
			}
			c.key = k
			next(w, r, c)
		}
	}
}

// refuseLive answers 503 to a live-environment key: live requests are not released.
func refuseLive(next callHandler) callHandler {
	return func(w http.ResponseWriter, r *http.Request, c *call) {
		if c.key.tenant.live {
			c.fail(w, errLive)
			return
		}
		next(w, r, c)
	}
}

// limitRate answers 429 when the key's bucket is empty, and states the limit on every
// answer to a keyed call from here on (IETF draft RateLimit header fields). A full bucket
// is one second's worth, so the time until it is full again (t) is always 1 second.
func limitRate(l *rateLimit, now func() time.Time) wrapper {
	return func(next callHandler) callHandler {
		if l == nil {
			return next
		}
		return func(w http.ResponseWriter, r *http.Request, c *call) {
			remaining, ok, wait := l.take(&c.key.bucket, now())
			h := w.Header()
			h.Set("RateLimit-Policy", l.policy)
			h.Set("RateLimit", `"default";r=`+strconv.Itoa(remaining)+`;t=1`)
			if !ok {
				h.Set("Retry-After", strconv.FormatInt(int64((wait+time.Second-1)/time.Second), 10))
				c.fail(w, errRateLimit)
				return
			}
			next(w, r, c)
		}
	}
}

// requireScope answers 403 unless the key holds the operation's scope.
func requireScope(need scope) wrapper {
	challenge := `Bearer error="insufficient_scope", scope="` + need.String() + `"`
	err := &apiError{code: codeInsufficientScope, detail: "The API key lacks the " + need.String() + " scope this operation requires."}
	return func(next callHandler) callHandler {
		return func(w http.ResponseWriter, r *http.Request, c *call) {
			if c.key.scopes&need == 0 {
				w.Header().Set("WWW-Authenticate", challenge)
				c.fail(w, err)
				return
			}
			next(w, r, c)
		}
	}
}

var (
	errLive      = &apiError{code: codeLiveNotReleased, detail: "Live requests are not released; this is a live-environment key. Use a test key with the local sandbox."}
	errRateLimit = &apiError{code: codeRateLimited, detail: "The sandbox rate limit for this key is reached. Retry after the Retry-After seconds."}
)

// ===== Prefer: a simulated answer, a delay, an instant of one's own =====

// The Prefer header (RFC 7240): a test-environment client may ask for an answer the sandbox
// never gives on its own (code=429|500|502|503, errors.go's simulatedAnswers), for a delay
// (delay=MS), to rehearse how its integration copes, and for the instant its request's
// resources are judged at (clock="<RFC 3339>" or "start+90s"), so that parallel tests on one
// tenant each keep their own time. simulate, the check after the scope, applies what
// parsePrefer reads.

// preferences are what a route reads of Prefer beyond code and delay, which every route
// that reads it applies.
type preferences uint8

const (
	codeAndDelay preferences = 0      // the clock operations: clock is ignored there
	withClock    preferences = 1 << 0 // clock: the instant the request's resources are judged at
	withFaults   preferences = 1 << 1 // -faults may fail a request that names no code: the four operations
)

// simulate applies a test client's Prefer header: a simulated answer, a delay and, as reads
// says, the instant the request's resources are judged at; and, on a route -faults may
// fail, the fault of a request that names no code. It runs right after the scope check, so
// a live key, a missing or bad key, a rate-limited key and a key without the scope get
// exactly what they would get without the header, a simulated answer shows no data, and a
// key's expiry is judged by its tenant's clock, not by Prefer's.
func (s *server) simulate(reads preferences) wrapper {
	read, apply := s.readPreferences(reads), s.applyPreferences(reads&withFaults != 0, false)
	return func(next callHandler) callHandler { return read(apply(next)) }
}

// readPreferences reads a request's Prefer header into its call (422 when it is refused).
// On a write it is read before the body and the idempotency store, and applied after them.
func (s *server) readPreferences(reads preferences) wrapper {
	return func(next callHandler) callHandler {
		return func(w http.ResponseWriter, r *http.Request, c *call) {
			if fields := r.Header["Prefer"]; len(fields) > 0 {
				p, err := parsePrefer(fields, reads, c.key.tenant.start)
				if err != nil {
					c.fail(w, err)
					return
				}
				c.run, c.prefer = p.run, &p
			}
			next(w, r, c)
		}
	}
}

// applyPreferences applies what the call's Prefer asks for: a simulated answer (or, where
// faultable, a fault of -faults), the instant its resources are judged at, and a delay. On
// a write, a code=502 is judged last, once the write is done (see serveWrite).
func (s *server) applyPreferences(faultable, write bool) wrapper {
	faultable = faultable && s.faults != nil
	return func(next callHandler) callHandler {
		return func(w http.ResponseWriter, r *http.Request, c *call) {
			if c.prefer == nil && !faultable {
				next(w, r, c)
				return
			}
			p := c.prefer
			if p == nil {
				p = &preference{codeAt: -1}
			}
			answer, problem := s.answerOf(p, r, c, faultable)
			if write && answer != nil && answer.code == codeProviderNotConfirmed {
				c.simulated, c.unconfirmed, answer = notSimulated, errUnconfirmedWrite, nil
			}
			if applied := p.appliedHeader(c.simulated == byPrefer); applied != "" {
				w.Header().Set("Preference-Applied", applied)
			}
			if p.clock != nil {
				c.at = *p.clock
			}
			if p.delay > 0 {
				s.delay(r, c, p.delay)
			}
			if answer != nil {
				if answer.retryAfter {
					w.Header().Set("Retry-After", "1")
				}
				c.fail(w, problem)
				return
			}
			next(w, r, c)
		}
	}
}

// answerOf is the answer a request gets instead of its own, with its problem, or nil: the
// code Prefer asks for, unless its sequence has failed its times already; or, where
// faultable and no code is asked for, the request's fault under -faults.
func (s *server) answerOf(p *preference, r *http.Request, c *call, faultable bool) (*simulatedAnswer, *apiError) {
	t := c.key.tenant
	switch {
	case p.code != nil && p.times > 0 && t.countRequest(sequenceOf(r.Method, targetOf(r), r.Header["Prefer"]), s.now()) > p.times:
		return nil, nil // past its times: the answer it would get without code
	case p.code != nil:
		c.simulated = byPrefer
		return p.code, p.code.prefer
	case faultable:
		k := t.faulted.Add(1)
		if answer := s.faults.judge(t.id, k); answer != nil {
			c.simulated = byFaults
			return answer, s.faults.problem(answer, t.id, k)
		}
	}
	return nil, nil
}

// targetOf is a request's target as sent: its path and query (of a target sent in
// absolute form, http://host/path?query, its path and query as sent).
func targetOf(r *http.Request) string {
	if strings.HasPrefix(r.RequestURI, "/") {
		return r.RequestURI
	}
	return r.URL.RequestURI()
}

// delay waits d before the answer: the request's body is read first, so that a client that
// goes away is noticed with or without one (nothing is sent then), and a shutdown answers
// at once, so that draining is not held up.
func (s *server) delay(r *http.Request, c *call, d time.Duration) {
	readAhead(r, c)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-s.stopping:
	case <-r.Context().Done():
		abort(c)
	}
}

// maxPreferDelay is the longest delay a request may ask for.
const maxPreferDelay = 10 * time.Second

// preference is what a request's Prefer header asks of the sandbox.
type preference struct {
	code    *simulatedAnswer // nil, or one of simulatedAnswers
	times   int              // the code fails only the first times requests of its sequence; 0: every one
	delay   time.Duration
	clock   *time.Time // the instant the request's resources are judged at; nil: the tenant's clock
	run     string     // the scenario the request belongs to (run="t-42"), "" for none
	applied []string   // what Preference-Applied names, in the order sent: code's, delay's, clock's
	codeAt  int        // where code's is in applied, or -1
}

// maxPreferences is how many preferences of a request are read, and how many parameters of
// each; the rest are ignored, so that a long header costs no more than a short one.
const maxPreferences = 16

// maxTimes is the most requests a sequence may fail: code=503; times=100.
const maxTimes = 100

var (
	errPreferClock = paramError(codeInvalidParameter, "Prefer", `Prefer clock must be an RFC 3339 timestamp with an offset, such as clock="2026-11-01T09:30:00Z", or an instant relative to the start instant, such as clock="start+90s".`)
	errPreferTimes = paramError(codeInvalidParameter, "Prefer", fmt.Sprintf("Prefer code's times must be a whole number from 1 to %d: code=503; times=2 fails the first two requests of a sequence.", maxTimes))
	errTimesTwice  = paramError(codeInvalidParameter, "Prefer", "Prefer code's times is given more than once; give it once, as in code=503; times=2.")
	errTimesAlone  = paramError(codeInvalidParameter, "Prefer", "Prefer times is a parameter of code: send code=503; times=2 (a semicolon, not a comma) to fail the first two requests of a sequence.")
	errPreferRun   = paramError(codeInvalidParameter, "Prefer", `Prefer run must be 1 to 64 characters of A-Z a-z 0-9 . _ -, such as run="t-42".`)
)

// parsePrefer reads the Prefer header fields (RFC 7240, section 2): comma-separated
// preferences, each a token with an optional value (token or quoted string) and optional
// parameters after ";". Names are case-insensitive; the first instance of a preference
// counts; preferences other than code, delay, run and (where reads says) clock are ignored,
// as the RFC says, and so are the parameters of any but code, but that times is code's
// alone. Faults are judged in the order sent.
func parsePrefer(fields []string, reads preferences, start time.Time) (preference, *apiError) {
	p := preference{codeAt: -1}
	var seenDelay, seenClock, seenRun bool
	read := 0
	for _, field := range fields {
		for rest := field; rest != "" && read < maxPreferences; read++ {
			var name, value, params string
			name, value, params, rest = nextPreference(rest)
			switch {
			case strings.EqualFold(name, "times"):
				return p, errTimesAlone
			case strings.EqualFold(name, "code"):
				if p.code != nil { // the first code counts, with its parameters; a later one is ignored whole
					continue
				}
				if err := p.readCode(value, params); err != nil {
					return p, err
				}
				continue
			case strings.EqualFold(name, "delay") && !seenDelay:
				seenDelay = true
				ms, ok := parseWhole(value, int(maxPreferDelay/time.Millisecond))
				if !ok {
					return p, paramError(codeInvalidParameter, "Prefer", "Prefer delay must be a whole number of milliseconds from 0 to 10000.")
				}
				p.delay = time.Duration(ms) * time.Millisecond
				p.applied = append(p.applied, "delay="+strconv.Itoa(ms))
			case reads&withClock != 0 && strings.EqualFold(name, "clock") && !seenClock:
				seenClock = true
				at, e := parseInstant(value, start)
				if e != nil {
					return p, errPreferClock
				}
				p.clock = &at
				p.applied = append(p.applied, `clock="`+formatTimestamp(at)+`"`)
			case strings.EqualFold(name, "run") && !seenRun:
				seenRun = true
				if !validRun(value) {
					return p, errPreferRun
				}
				p.run = value
			}
			if hasParameter(params, "times") {
				return p, errTimesAlone
			}
		}
	}
	return p, nil
}

// runOf is the run that Prefer fields name, read as parsePrefer reads it (the first run
// counts), or "" for none or a bad one: an entry carries the run of its request whatever
// step answered it, also one before the Prefer step or the Prefer step's own refusal.
func runOf(fields []string) string {
	read := 0
	for _, field := range fields {
		for rest := field; rest != "" && read < maxPreferences; read++ {
			var name, value string
			name, value, _, rest = nextPreference(rest)
			if strings.EqualFold(name, "run") {
				if !validRun(value) {
					return ""
				}
				return value
			}
		}
	}
	return ""
}

// readCode reads the code preference, its value and its parameters: times=N alone.
func (p *preference) readCode(value, params string) *apiError {
	if p.code = simulatedAnswerOf(value); p.code == nil {
		return paramError(codeInvalidParameter, "Prefer", "Prefer code must be one of "+simulatedStatuses()+".")
	}
	p.codeAt, p.applied = len(p.applied), append(p.applied, "code="+value)
	for n := 0; n < maxPreferences; n++ {
		name, value, rest, ok := nextParameter(params)
		if !ok {
			return nil
		}
		params = rest
		switch {
		case !strings.EqualFold(name, "times"):
			return paramError(codeInvalidParameter, "Prefer", "Prefer code takes one parameter, times (code=503; times=2): "+strconv.Quote(name)+" is not it.")
		case p.times != 0:
			return errTimesTwice
		}
		times, ok := parseWhole(value, maxTimes)
		if !ok || times < 1 {
			return errPreferTimes
		}
		p.times = times
	}
	return nil
}

// appliedHeader is the Preference-Applied value, with code's named or not (a code whose
// sequence has failed its times, or a fault of -faults, answers without it).
func (p *preference) appliedHeader(codeApplied bool) string {
	if codeApplied || p.codeAt < 0 {
		return strings.Join(p.applied, ", ")
	}
	return strings.Join(slices.Delete(slices.Clone(p.applied), p.codeAt, p.codeAt+1), ", ")
}

// nextPreference reads the first preference off s in one pass: its name and value (a token,
// or a quoted string's content), the text of its parameters, and what follows the comma
// that ends it.
func nextPreference(s string) (name, value, params, rest string) {
	name, value, s = nextWord(s)
	for quoted, i := false, 0; i < len(s); i++ { // parameters, up to the comma outside quotes
		switch {
		case quoted && s[i] == '\\':
			i++
		case s[i] == '"':
			quoted = !quoted
		case !quoted && s[i] == ',':
			return name, value, s[:i], s[i+1:]
		}
	}
	return name, value, s, ""
}

// nextParameter reads the first parameter off the parameters of a preference ("; a=1; b"):
// ok is false when none is left.
func nextParameter(params string) (name, value, rest string, ok bool) {
	params = strings.TrimLeft(params, " \t;")
	if params == "" {
		return "", "", "", false
	}
	name, value, rest = nextWord(params)
	return name, value, rest, true
}

// hasParameter reports whether the parameters of a preference name one of this name.
func hasParameter(params, want string) bool {
	for n := 0; n < maxPreferences; n++ {
		name, _, rest, ok := nextParameter(params)
		if !ok {
			return false
		}
		if strings.EqualFold(name, want) {
			return true
		}
		params = rest
	}
	return false
}

// nextWord reads a name and its optional value (a token, or a quoted string's content) off
// s, up to the ; or , that follows them, which it leaves in rest.
func nextWord(s string) (name, value, rest string) {
	i := strings.IndexAny(s, "=;,")
	if i < 0 {
		return strings.TrimSpace(s), "", ""
	}
	name = strings.TrimSpace(s[:i])
	if s[i] != '=' {
		return name, "", s[i:]
	}
	v := strings.TrimLeft(s[i+1:], " \t")
	if v != "" && v[0] == '"' {
		end := 1
		for end < len(v) && v[end] != '"' {
			if v[end] == '\\' {
				end++
			}
			end++
		}
		end = min(end+1, len(v))
		return name, unquote(v[:end]), v[end:]
	}
	end := strings.IndexAny(v, ";,")
	if end < 0 {
		end = len(v)
	}
	return name, strings.TrimSpace(v[:end]), v[end:]
}

// unquote returns the content of a quoted-string, or s itself when it is a token.
func unquote(s string) string {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return s
	}
	var b strings.Builder
	for i := 1; i < len(s)-1; i++ {
		if s[i] == '\\' && i+1 < len(s)-1 {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ===== Faults for clients that cannot send a header =====

// -faults rate=R,codes=C|C,seed=S fails a share of the requests to the four operations that
// name no Prefer code, the same ones at every start, and says so in each answer's detail;
// simulate judges them.

// faultPlan is the -faults setting.
type faultPlan struct {
	rate    uint64 // in millionths: 0 to 1,000,000
	answers []*simulatedAnswer
	seed    uint64
	spec    string // as given
}

// parseFaults reads -faults: rate=R (digits, then optionally a point and 1 to 6 digits, from
// 0 to 1; required), codes=C|C... (from the simulated answers, none twice; default 503) and
// seed=S (0 to 2^64-1; default 1), each at most once, separated by commas.
func parseFaults(spec string) (*faultPlan, error) {
	f := &faultPlan{seed: 1, spec: spec, answers: []*simulatedAnswer{simulatedAnswerOf("503")}}
	given := map[string]bool{}
	for _, part := range strings.Split(spec, ",") {
		name, value, _ := strings.Cut(part, "=")
		if given[name] {
			return nil, fmt.Errorf("%s is given twice", name)
		}
		given[name] = true
		var err error
		switch name {
		case "rate":
			f.rate, err = parseRate(value)
		case "codes":
			f.answers, err = parseFaultCodes(value)
		case "seed":
			if f.seed, err = strconv.ParseUint(value, 10, 64); err != nil || strings.Trim(value, "0123456789") != "" {
				err = fmt.Errorf("seed=%s is not a whole number from 0 to 18446744073709551615", value)
			}
		default:
			err = fmt.Errorf("%q is not a part of it: want rate=R,codes=C|C,seed=S, such as rate=0.05,codes=503|429,seed=7", part)
		}
		if err != nil {
			return nil, err
		}
	}
	if !given["rate"] {
		return nil, errors.New("rate is required, such as rate=0.05")
	}
	return f, nil
}

// parseRate reads a rate from 0 to 1 in millionths: digits, then optionally a point and 1
// to 6 digits (0, 0.05, 1.0).
func parseRate(value string) (uint64, error) {
	whole, frac, point := strings.Cut(value, ".")
	w, okWhole := parseWhole(whole, 1)
	f, okFrac := parseWhole(frac+strings.Repeat("0", max(0, 6-len(frac))), 999999)
	if !okWhole || point && (!okFrac || len(frac) == 0 || len(frac) > 6) || w == 1 && f > 0 {
		return 0, fmt.Errorf("rate=%s is not a rate from 0 to 1 written as digits, then optionally a point and 1 to 6 digits (0, 0.05, 1.0)", value)
	}
	return uint64(w*1000000 + f), nil
}

// parseFaultCodes reads codes=C|C...: statuses of the simulated answers, none twice.
func parseFaultCodes(value string) ([]*simulatedAnswer, error) {
	var answers []*simulatedAnswer
	for _, status := range strings.Split(value, "|") {
		a := simulatedAnswerOf(status)
		if a == nil || slices.Contains(answers, a) {
			return nil, fmt.Errorf("codes=%s: each code is one of %s, none twice, separated by |", value, simulatedStatuses())
		}
		answers = append(answers, a)
	}
	return answers, nil
}

// judge is the answer the k-th request of tenant t that -faults may fail fails with, or
// nil. h, the first 8 bytes of the SHA-256 of "S/account/environment/k" read as a
// big-endian unsigned integer over 2^64, fails it when it is under the rate R, with the
// answer at floor(h / R * len(answers)); in whole numbers, so that a client can predict it:
// h < R is x*10^6 < rate*2^64, and the index the high word of x*10^6*len over rate.
func (f *faultPlan) judge(t tenantID, k uint64) *simulatedAnswer {
	sum := sha256.Sum256([]byte(strconv.FormatUint(f.seed, 10) + "/" + t.account + "/" + t.environment + "/" + strconv.FormatUint(k, 10)))
	x := binary.BigEndian.Uint64(sum[:8])
	if hi, _ := bits.Mul64(x, 1000000); f.rate == 0 || hi >= f.rate {
		return nil
	}
	hi, _ := bits.Mul64(x, 1000000*uint64(len(f.answers)))
	return f.answers[hi/f.rate]
}

// problem is a fault's answer: the simulated one's code, with a detail that says -faults
// injected it, and which request of which tenant it was.
func (f *faultPlan) problem(a *simulatedAnswer, t tenantID, k uint64) *apiError {
	return &apiError{code: a.code, detail: fmt.Sprintf("Injected by -faults %s: request %d of %s to the operations fails. %s", f.spec, k, t, a.what)}
}

// describe says what the plan does, for the banner and the page.
func (f *faultPlan) describe() string {
	var codes []string
	for _, a := range f.answers {
		codes = append(codes, a.status)
	}
	return fmt.Sprintf("-faults %s: %s of the requests to the four operations that name no Prefer code fail (%s), the same ones at every start.", f.spec, strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.4f", float64(f.rate)/1e4), "0"), ".")+"%", strings.Join(codes, ", "))
}

// ===== The body: read once, up to its cap =====

// readBody reads a request's body, up to maxBodyBytes (413 past it, and the connection is
// closed), and hands it on in memory, in the call: the checks before it are passed, and
// what comes after reads it there. A body whose chunked framing the client broke is a 400, and
// the connection is closed; a client that went away gets nothing (logged 499).
func (s *server) readBody(next callHandler) callHandler {
	return func(w http.ResponseWriter, r *http.Request, c *call) {
		if r.Body == nil || r.Body == http.NoBody {
			c.bodySize = 0
			next(w, r, c)
			return
		}
		b, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBodyBytes))
		c.bodySize = int64(len(b))
		var tooLarge *http.MaxBytesError
		switch {
		case errors.As(err, &tooLarge):
			refuseTooLarge(w, c)
			return
		case err != nil && clientGone(r, err):
			abort(c)
		case err != nil:
			s.log.Warn("request body framing broken", "request_id", c.id, "error", err.Error())
			w.Header().Set("Connection", "close")
			c.fail(w, &apiError{code: codeMalformedJSON, detail: "The request body's chunked framing is broken (" + err.Error() + "). Send the body with a Content-Length, or as well-formed chunks."})
			return
		}
		c.body = b
		next(w, r, c)
	}
}

// clientGone reports whether err, met reading r's body, means that the client went away
// (or stalled past the read timeout) rather than that it broke the body's framing.
func clientGone(r *http.Request, err error) bool {
	var netErr net.Error
	return r.Context().Err() != nil || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.As(err, &netErr)
}

// readAhead reads a request's body into memory, up to one byte past the cap, and leaves
// it for readBody to judge, with the fault of a broken framing: net/http notices a client
// that goes away only once the body is read, so a delay reads it first.
func readAhead(r *http.Request, c *call) {
	if r.Body == nil || r.Body == http.NoBody {
		return
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, maxBodyBytes+1))
	rest := io.Reader(http.NoBody)
	switch {
	case err != nil && clientGone(r, err):
		abort(c)
	case err != nil:
		rest = failedRead{err}
	case len(b) > maxBodyBytes:
		rest = r.Body // readBody refuses it: 413, and the connection is closed
	}
	r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(b), rest))
}

// failedRead is a body whose reading failed with err.
type failedRead struct{ err error }

func (f failedRead) Read([]byte) (int, error) { return 0, f.err }

// abort ends a request whose client went away or cannot be answered whole: nothing is sent
// (net/http cuts the connection rather than let a part pass for a whole answer), and the
// request is logged 499.
func abort(c *call) {
	c.status = statusClientClosedRequest
	panic(http.ErrAbortHandler)
}

// statusClientClosedRequest is logged for a request whose client went away before the
// answer (nginx's 499); nothing is sent.
const statusClientClosedRequest = 499

// ===== Writes: Idempotency-Key, and the answers stored under it =====

// The writes (test helpers that stand in for the real API's writes) pass the checks of a
// keyed route, then the spec's rules for writes: each carries one stored, unique
// idempotency value, Idempotency-Key (the IETF httpapi draft's header, and Stripe's). A
// repeat after the first finished is answered the first's answer again; a repeat while it
// runs, or the same key with another method, path or body, is 409. Only a write that was
// done is stored: after any other answer the key is free again.

const (
	maxIdempotencyKey    = 255
	storedAnswerLife     = 24 * time.Hour
	maxStoredAnswers     = 10000    // a tenant's; beyond, the least recently used is forgotten
	maxStoredAnswerBytes = 64 << 20 // every tenant's together
)

// write wraps a write in the checks of the contract, in its order: (route and method by the
// mux), declared body size (413), key (401, its expiry by the wall clock), live environment
// (503), rate limit (429), Idempotency-Key (400), Prefer (422), the body to its cap (413),
// the idempotency store (the first answer again, or 409), Prefer's delay (the key held
// meanwhile) and code 429, 500 or 503 (nothing written); then h, which judges the query, the
// body and the state and writes; a Prefer code=502 answers last, once the write is done.
func (s *server) write(reads preferences, h writeHandler) callHandler {
	return chain(s.serveWrite(h), capDeclared, requireKey(&s.keys, s.now, wallClock, s.book.journaling()), refuseLive, limitRate(s.rate, s.now),
		requireIdempotencyKey, s.readPreferences(reads), s.readBody, s.idempotent, s.applyPreferences(false, true))
}

// writeHandler is the work of a write once every check but its body's has passed (a write
// takes no query parameter): it reads the body in the call and returns the answer it wrote,
// or the error to answer with (then nothing was written).
type writeHandler func(c *call) (*storedAnswer, error)

var errIdempotencyKey = paramError(codeInvalidIdempotencyKey, "Idempotency-Key", fmt.Sprintf(
	`Send one Idempotency-Key header with each write: 1 to %d visible ASCII characters other than " and \, bare (a1b2c3) or quoted ("a1b2c3"); a new one for each write, the same one to retry it.`, maxIdempotencyKey))

// parseIdempotencyKey reads the Idempotency-Key fields: one field, the key bare or as one
// RFC 8941 string (the quotes are not part of it), 1 to maxIdempotencyKey characters from
// 0x21 to 0x7E but " and \.
func parseIdempotencyKey(fields []string) (string, *apiError) {
	if len(fields) != 1 {
		return "", errIdempotencyKey
	}
	key := fields[0]
	if len(key) >= 2 && key[0] == '"' && key[len(key)-1] == '"' {
		key = key[1 : len(key)-1]
	}
	if key == "" || len(key) > maxIdempotencyKey {
		return "", errIdempotencyKey
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x21 || c > 0x7e || c == '"' || c == '\\' {
			return "", errIdempotencyKey
		}
	}
	return key, nil
}

// requireIdempotencyKey answers 400 unless a write carries one good Idempotency-Key.
func requireIdempotencyKey(next callHandler) callHandler {
	return func(w http.ResponseWriter, r *http.Request, c *call) {
		key, err := parseIdempotencyKey(r.Header["Idempotency-Key"])
		if err != nil {
			c.fail(w, err)
			return
		}
		c.idempotencyKey = key
		next(w, r, c)
	}
}

// storedAnswer is the answer of a write that was done, as stored under its
// Idempotency-Key: never changed once made.
type storedAnswer struct {
	status      int
	contentType string
	location    string
	body        []byte
	shown       showing // what it showed, for the journal: the shipment a booking created
}

// idempotencyEntry is what a tenant keeps under an Idempotency-Key: the digest of the
// request that claimed it (its method, path and body; a repeat must be the same request),
// and, once its write is done, the write's answer and when it was stored; answer is nil
// while the write is in progress.
type idempotencyEntry struct {
	request [sha256.Size]byte
	answer  *storedAnswer
	stored  time.Time // by the wall clock: kept storedAnswerLife
}

// cost is what an answer stored under key holds, as the book counts it.
func (a *storedAnswer) cost(key string) int64 {
	return int64(len(key)+len(a.body)+len(a.location)) + int64(unsafe.Sizeof(idempotencyEntry{})+unsafe.Sizeof(storedAnswer{})) + 96
}

// claim claims the Idempotency-Key key of t for a request at now: what is stored under it
// (found true; read under t's lock, and never changed after), or, when nothing is, the key
// held in progress for this request, pinned in t's list until settle. A tenant forgotten
// meanwhile has no keys (errForgotten).
func (b *tenantBook) claim(t *tenant, key string, request [sha256.Size]byte, now time.Time) (idempotencyEntry, bool, *apiError) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if b.hooks.claiming != nil {
		b.hooks.claiming(t)
	}
	if t.gone.Load() {
		return idempotencyEntry{}, false, errForgotten
	}
	if e, ok := t.answers.get(key); ok {
		if e.answer == nil || now.Sub(e.stored) < storedAnswerLife {
			return e, true, nil
		}
		_, w, _ := t.answers.remove(key) // past its day: the key is new again
		b.unstore(t, w)
	}
	t.answers.add(key, idempotencyEntry{request: request}, 0, true)
	b.unstore(t, t.answers.trim())
	return idempotencyEntry{}, false, nil
}

// settle ends the write that claimed key of t: its answer is stored, when the write was
// done (written), else the key is free again. Past the bytes of every tenant's stored
// answers, the oldest of the tenant that holds the most go; a forgotten tenant keeps none.
func (b *tenantBook) settle(t *tenant, key string, written *storedAnswer, now time.Time) {
	t.mu.Lock()
	e, ok := t.answers.peek(key)
	if t.gone.Load() || !ok || e.answer != nil {
		t.mu.Unlock()
		return
	}
	over := false
	if written == nil {
		_, w, _ := t.answers.remove(key)
		b.unstore(t, w)
	} else {
		cost := written.cost(key)
		t.answers.set(key, idempotencyEntry{e.request, written, now}, cost, false)
		t.answerBytes.Add(cost)
		over = b.answerTotal.Add(cost) > b.maxAnswerBytes
	}
	b.unstore(t, t.answers.trim()) // back within its count, once its entries in progress end
	t.mu.Unlock()
	if over {
		b.makeAnswerRoom()
	}
}

// unstore takes what t's stored answers no longer hold off the counts; t.mu is held.
func (b *tenantBook) unstore(t *tenant, freed int64) {
	t.answerBytes.Add(-freed)
	b.answerTotal.Add(-freed)
}

// makeAnswerRoom forgets the oldest stored answers of the tenant that holds the most until
// every tenant's together are within the bound (entries in progress hold nothing).
func (b *tenantBook) makeAnswerRoom() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.answerTotal.Load() > b.maxAnswerBytes {
		t := b.largest(func(t *tenant) int64 { return t.answerBytes.Load() })
		if t == nil {
			return
		}
		t.mu.Lock()
		freed := t.answers.shed(b.answerTotal.Load() - b.maxAnswerBytes)
		b.unstore(t, freed)
		t.mu.Unlock()
		if freed == 0 {
			return
		}
	}
}

// errUnconfirmedWrite is a write's Prefer: code=502, answered once the write is done.
var errUnconfirmedWrite = &apiError{code: codeProviderNotConfirmed, detail: "Simulated at your request (Prefer: code=502): the provider did not confirm the operation, which may have been done. Do not retry it blindly: send it again with the same Idempotency-Key, which answers the first write's result."}

var (
	errKeyInUse  = &apiError{code: codeIdempotencyKeyInUse, detail: "A request with this Idempotency-Key is still in progress: retry after the Retry-After seconds to get its answer."}
	errKeyReused = &apiError{code: codeIdempotencyKeyReused, detail: "This Idempotency-Key was sent with another method, path or body: use a new key for a new write, and the same key with the same request only to retry it."}
)

// idempotent answers a repeat of a write from the store: the first's answer again, byte for
// byte, with Idempotent-Replayed: true; 409 while the first is in progress, or when the key
// came with another request. A new key is held in progress while the write runs, and its
// answer stored if the write was done.
func (s *server) idempotent(next callHandler) callHandler {
	return func(w http.ResponseWriter, r *http.Request, c *call) {
		c.write = &writeMark{c.idempotencyKey, sha256.Sum256(c.body)}
		request := sha256.Sum256(append([]byte(r.Method+"\x00"+r.URL.Path+"\x00"), c.write.body[:]...))
		t := c.key.tenant
		stored, found, err := s.book.claim(t, c.idempotencyKey, request, s.now())
		switch {
		case err != nil:
			c.fail(w, err)
		case !found:
			defer func() { s.book.settle(t, c.idempotencyKey, c.written, s.now()) }()
			if s.book.hooks.claimed != nil {
				s.book.hooks.claimed(t, c.idempotencyKey)
			}
			next(w, r, c)
		case stored.request != request:
			c.fail(w, errKeyReused)
		case stored.answer == nil:
			w.Header().Set("Retry-After", "1")
			c.fail(w, errKeyInUse)
		default:
			w.Header().Set("Idempotent-Replayed", "true")
			c.shown = stored.answer.shown
			stored.answer.write(w)
		}
	}
}

// write sends a stored answer: its status, Content-Type, Location and body.
func (a *storedAnswer) write(w http.ResponseWriter) {
	if a.location != "" {
		w.Header().Set("Location", a.location)
	}
	writeBody(w, a.status, a.contentType, a.body)
}

// serveWrite refuses a query parameter (422), runs a write's work on its body and answers
// with what it wrote, or with the error it returns; a Prefer code=502 answers instead once
// the write is done (and stored): "provider operation not confirmed; a booking is not
// retried blindly".
func (s *server) serveWrite(h writeHandler) callHandler {
	return func(w http.ResponseWriter, r *http.Request, c *call) {
		var written *storedAnswer
		err := refuseParams(r.URL.RawQuery)
		if err == nil {
			written, err = h(c)
		}
		if err != nil && c.key.tenant.gone.Load() {
			// Its sandbox was forgotten while it ran (its key checked before the DELETE):
			// whatever its checks found in the data it still held, nothing was written, and
			// its key is unknown from now on. Say so rather than answer a 409 or a 404 of data
			// that no longer exists.
			err = errForgotten
		}
		if err != nil {
			s.writeError(w, c, err)
			return
		}
		c.written = written
		if c.unconfirmed != nil {
			c.simulated = byPrefer
			w.Header().Set("Preference-Applied", c.prefer.appliedHeader(true))
			c.fail(w, c.unconfirmed)
			return
		}
		written.write(w)
	}
}

// ===== The handlers: the four operations and the test helpers =====

// Each reads its wildcard (named in the route table) and asks the tenant's index, which
// takes values and answers bytes or an error; each notes in the call what its answer
// shows, for the journal. The writes' handlers (a sandbox made, a shipment created) come
// last: they return the answer the write wrapper stores under the Idempotency-Key.

func trackingByID(w http.ResponseWriter, r *http.Request, c *call) error {
	v, s, err := c.data.shipments.viewByID(r.PathValue("id"), c.at)
	return writeView(w, c, v, s, err)
}

func trackingByNumber(w http.ResponseWriter, r *http.Request, c *call) error {
	number := r.PathValue("tracking_number")
	v, s, err := c.data.shipments.viewByNumber(number, c.at)
	switch {
	case err == errTrackingAmbiguous && c.data.adapter: // the domain adapter's 409
		return ambiguousNumber(c.data.shipments.holdersAt(number, c.at))
	case err == errTrackingAmbiguous:
		c.shown = showing{kind: showsSharedNumber, ship: s}
	}
	return writeView(w, c, v, s, err)
}

// ambiguousNumber is the domain adapter's answer to a number n shipments hold: 409.
func ambiguousNumber(n int) *apiError {
	return &apiError{code: codeAmbiguousNumber, detail: fmt.Sprintf("This tracking number is held by %d shipments in this account and environment: read each by its shipment ID (GET /v1/shipments/{id}/tracking). The domain adapter answers 409 here; the sandbox's profile answers 404.", n)}
}

// writeView answers with a tracking view of s, or returns the error found instead.
func writeView(w http.ResponseWriter, c *call, v view, s *shipment, err error) error {
	if err != nil {
		return err
	}
	c.shown = showing{kind: showsShipment, ship: s}
	writeBody(w, http.StatusOK, jsonContentType, v[:]...)
	return nil
}

func getOrder(w http.ResponseWriter, r *http.Request, c *call) error {
	b, i, err := c.data.orders.get(r.PathValue("id"), c.at)
	if err != nil {
		return err
	}
	c.shown = showing{kind: showsOrder, order: int32(i)}
	writeBody(w, http.StatusOK, jsonContentType, b)
	return nil
}

// listOrders answers GET /v1/orders: a page (up to 100 orders, some 16 KiB) is assembled
// in a pooled buffer and written in one write.
func (s *server) listOrders(w http.ResponseWriter, r *http.Request, c *call) error {
	buf := s.pages.Get().(*[]byte)
	defer s.pages.Put(buf)
	b, page, err := c.data.orders.page((*buf)[:0], r.URL.RawQuery, s.cursors, c.at)
	*buf = b
	if err != nil {
		return err
	}
	c.shown = showing{kind: showsPage, page: page}
	writeBody(w, http.StatusOK, jsonContentType, b)
	return nil
}

// noParams wraps an operation that takes no query parameters: any is unknown (422).
func noParams(h keyedHandler) keyedHandler {
	return func(w http.ResponseWriter, r *http.Request, c *call) error {
		if err := refuseParams(r.URL.RawQuery); err != nil {
			return err
		}
		return h(w, r, c)
	}
}

func (s *server) getClock(w http.ResponseWriter, r *http.Request, c *call) error {
	return s.clocks.get(w, c.key.tenant, c.clock)
}

func (s *server) setClock(w http.ResponseWriter, r *http.Request, c *call) error {
	return s.clocks.set(w, c.body, c.key.tenant)
}

func getTimeline(w http.ResponseWriter, r *http.Request, c *call) error {
	b, err := c.data.timelineAt(c.at)
	if err != nil {
		return err
	}
	writeBody(w, http.StatusOK, jsonContentType, b)
	return nil
}

// readRequests answers GET /v1/test_helpers/requests: the journal's entries after a seq,
// as JSON or as a HAR log whose URLs name the address the reader used.
func (s *server) readRequests(w http.ResponseWriter, r *http.Request, c *call) error {
	part, har, err := journalPartOf(r, c, true)
	if err != nil {
		return err
	}
	d := c.key.tenant.current()
	if har {
		return writeJSON(w, harOf(part.entries, originOf(r, s.origin)))
	}
	answer := requestsAnswer{Data: make([]entryJSON, len(part.entries)), HasMore: part.more, LastSeq: part.last, Dropped: part.dropped}
	for i := range part.entries {
		answer.Data[i] = d.entryJSONOf(&part.entries[i])
	}
	return writeJSON(w, answer)
}

// readFindings answers GET /v1/test_helpers/findings: the findings of the journal's entries
// after a seq.
func (s *server) readFindings(w http.ResponseWriter, r *http.Request, c *call) error {
	part, _, err := journalPartOf(r, c, false)
	if err != nil {
		return err
	}
	data, n := c.key.tenant.current().findingsIn(part.entries, maxFindings)
	answer := findingsAnswer{Data: data, More: n - len(data), Dropped: part.dropped}
	if n := len(part.entries); n > 0 {
		answer.Judged = &judgedSeqs{part.entries[0].seq, part.entries[n-1].seq}
	}
	return writeJSON(w, answer)
}

// journalPartOf is the part of the caller's journal a read's query asks for (of the
// requests, as HAR or not), or the query's fault.
func journalPartOf(r *http.Request, c *call, requests bool) (part journalPart, har bool, err error) {
	q, har, err := parseJournalQuery(r.URL.RawQuery, requests)
	if err != nil {
		return journalPart{}, false, err
	}
	return c.key.tenant.journalPart(q), har, nil
}

// writeJSON answers 200 with v as JSON.
func writeJSON(w http.ResponseWriter, v any) error {
	b, err := marshalJSON(v)
	if err != nil {
		return err
	}
	writeBody(w, http.StatusOK, jsonContentType, b)
	return nil
}

// makeSandbox answers POST /v1/test_helpers/sandboxes: a sandbox of its own for the caller.
func (s *server) makeSandbox(c *call) (*storedAnswer, error) {
	b, err := s.book.makeSandbox(c.body, c.key, s.templates, s.now())
	if err != nil {
		return nil, err
	}
	return &storedAnswer{status: http.StatusCreated, contentType: jsonContentType, body: b}, nil
}

// createShipment answers POST /v1/test_helpers/shipments: a shipment created in the
// caller's sandbox at the request's instant, linking the order it names; 201 with its
// tracking view as GET shows it then.
func (s *server) createShipment(c *call) (*storedAnswer, error) {
	rec, err := readBooking(c.body)
	if err != nil {
		return nil, err
	}
	var created *shipment
	d, err := c.key.tenant.write(s.book, func(d *tenantData) (next *tenantData, err error) {
		next, created, err = d.withShipment(rec, c.at)
		return next, err
	})
	if err != nil {
		return nil, err
	}
	c.data, c.shown = d, showing{kind: showsCreated, ship: created}
	v := created.viewAt(c.at)
	return &storedAnswer{status: http.StatusCreated, contentType: jsonContentType, location: "/v1/shipments/" + url.PathEscape(created.id) + "/tracking",
		body: slices.Concat(v[:]...), shown: c.shown}, nil
}

var errNoSandbox = &apiError{code: codeNotFound, detail: "No sandbox of this account is named by the key: a key deletes the sandbox it was made for, and a dataset's account is never deleted."}

// deleteSandbox answers DELETE /v1/test_helpers/sandboxes/{account}: a key of that sandbox
// forgets it at once; any other account is 404.
func (s *server) deleteSandbox(w http.ResponseWriter, r *http.Request, c *call) error {
	t := c.key.tenant
	if t.sandbox == nil || t.id.account != r.PathValue("account") || !s.book.forget(t.id.account) {
		return errNoSandbox
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// ===== Writing an answer: a problem, and the journal's entry =====

// fail answers with the problem e, noting its code.
func (c *call) fail(w http.ResponseWriter, e *apiError) {
	c.code = e.code
	writeProblem(w, c.id, e)
}

// writeError answers with err: an error of the API as it is, any other logged with the
// request id and answered as an internal error that shows nothing of it.
func (s *server) writeError(w http.ResponseWriter, c *call, err error) {
	var e *apiError
	if !errors.As(err, &e) {
		s.log.Error("internal error", "request_id", c.id, "error", err.Error())
		e = errInternal
	}
	c.fail(w, e)
}

// writeEntry writes the entry of a request journaled in its key's tenant, once, when its
// status is known: before its body, so that a client that has its answer finds its entry.
// It keeps what the request already holds (its line, its Prefer) and copies only what it
// cuts.
func (s *server) writeEntry(sw *statusWriter) {
	c, r := &sw.c, sw.r
	if c.journal == nil || c.journaled {
		return
	}
	c.journaled = true
	e := journalEntry{arrived: c.arrived.UnixNano(), duration: int64(time.Since(c.arrived)), clock: instantOf(c.at), key: c.journal,
		method: ownMethod(r.Method), routePath: sw.route, target: boundValue(targetOf(r), maxJournalTarget), runTag: c.run, requestID: c.id, code: c.code,
		size: -1, retryAfter: -1, status: int16(c.status), simulated: c.simulated, shown: c.shown, bodySize: c.bodySize, writes: c.data.writes, write: c.write}
	if e.bodySize < 0 && r.ContentLength >= 0 {
		e.bodySize = r.ContentLength // answered before its body was read
	}
	h := sw.Header()
	if v := h["Content-Type"]; len(v) > 0 {
		e.contentType = v[0]
	}
	if v := h["Content-Length"]; len(v) > 0 {
		if n, err := strconv.ParseInt(v[0], 10, 64); err == nil {
			e.size = n
		}
	}
	if v := h["Retry-After"]; len(v) > 0 {
		if n, err := strconv.ParseInt(v[0], 10, 32); err == nil {
			e.retryAfter = int32(n)
		}
	}
	if p := r.Header["Prefer"]; len(p) > 0 {
		if e.runTag == "" { // answered before its Prefer was read (401, 403, 429), or refused there
			e.runTag = runOf(p)
		}
		e.hasPrefer, e.prefer = true, p[0]
		if len(p) > 1 {
			e.prefer = strings.Join(p, ", ")
		}
		if len(e.prefer) > maxJournalPrefer { // cut: keep neither the whole field nor the run inside it
			e.prefer, e.runTag = boundValue(e.prefer, maxJournalPrefer), strings.Clone(e.runTag)
		}
	}
	if k := r.Header["Idempotency-Key"]; len(k) > 0 {
		e.hasIdempotencyKey, e.idempotencyKey = true, boundValue(strings.Join(k, ", "), maxJournalPrefer)
	}
	s.book.keepEntry(c.journal.tenant, &e)
}

// ownMethod is a journaled request's method as a string of its own: net/http cuts it from
// the request line, which an entry would otherwise keep whole (up to the header limit)
// while the book counts only what the entry shows. The methods journaled routes answer
// (GET, HEAD, POST and DELETE) are constants, which cost nothing; any other is copied.
func ownMethod(m string) string {
	switch m {
	case http.MethodGet:
		return http.MethodGet
	case http.MethodHead:
		return http.MethodHead
	case http.MethodPost:
		return http.MethodPost
	case http.MethodDelete:
		return http.MethodDelete
	}
	return strings.Clone(m)
}

// ===== The access log =====

// One JSON line per request, byte for byte what slog's JSONHandler writes for the record
// {msg: "request", method, route, status, duration, request_id, account, environment} (a
// test holds the two together), written without making a record: it is the one log line
// every request pays for.

// logRequest writes the access log's line for a request that ended at at, d after it began.
func (s *server) logRequest(method, route string, c *call, at time.Time, d time.Duration) {
	if s.access == nil {
		return
	}
	var account, environment string
	if c.key != nil {
		account, environment = c.key.tenant.id.account, c.key.tenant.id.environment
	}
	// Formatted here, outside the log's lock, in a buffer that stays on the stack (Write
	// only copies it): formatted under the lock, lines from both cores would queue on it.
	var buf [512]byte
	s.access.Write(appendRequestLine(buf[:0], at, method, route, c.status, d, c.id, account, environment))
}

// maxLogValue bounds a logged value a client controls: longer, it is logged as its first
// maxLogValue-3 bytes (cut at a UTF-8 boundary) and "...".
const maxLogValue = 256

func boundLogValue(s string) string { return boundValue(s, maxLogValue) }

// boundValue is s, or, when s is over limit bytes, its first limit-3 bytes (cut at a UTF-8
// boundary) and "...".
func boundValue(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	end := limit - 3
	for end > 0 && !utf8.RuneStart(s[end]) {
		end--
	}
	return s[:end] + "..."
}

func appendRequestLine(b []byte, at time.Time, method, route string, status int, d time.Duration, id, account, environment string) []byte {
	b = append(b, `{"time":"`...)
	b = at.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","level":"INFO","msg":"request","method":`...)
	b = appendJSONString(b, boundLogValue(method))
	b = append(b, `,"route":`...)
	b = appendJSONString(b, route)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, `,"duration":`...)
	b = strconv.AppendInt(b, int64(d), 10)
	b = append(b, `,"request_id":`...)
	b = appendJSONString(b, id)
	b = append(b, `,"account":`...)
	b = appendJSONString(b, account)
	b = append(b, `,"environment":`...)
	b = appendJSONString(b, environment)
	return append(b, '}', '\n')
}

// logBuffer batches log lines for out. A request only appends its line to a buffer under
// a lock; the system calls that write the lines out are made by a goroutine of its own,
// every interval, as soon as logFlushSize bytes wait, and at Close. Should out fall behind
// by logMaxBacklog, writers wait for it rather than let the backlog grow without bound.
// An interval of 0 writes each line straight out.
type logBuffer struct {
	out     io.Writer
	mu      sync.Mutex
	room    sync.Cond // signalled when the flusher takes the backlog, and at Close
	buf     []byte    // lines not yet taken by the flusher
	scratch []byte    // a line on its way straight out, once closed
	closed  bool      // after Close (or with no interval), lines are written straight to out
	kick    chan struct{}
	stop    chan struct{}
	done    chan struct{}
}

const (
	logFlushSize  = 64 << 10
	logMaxBacklog = 4 << 20
)

func newLogBuffer(out io.Writer, every time.Duration) *logBuffer {
	l := &logBuffer{out: out, kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	l.room.L = &l.mu
	if every <= 0 {
		l.closed = true
		close(l.done)
		return l
	}
	go l.flushEvery(every)
	return l
}

func (l *logBuffer) flushEvery(every time.Duration) {
	defer close(l.done)
	t := time.NewTicker(every)
	defer t.Stop()
	var spare []byte
	for {
		select {
		case <-t.C:
		case <-l.kick:
		case <-l.stop:
			return
		}
		// Swap buffers under the lock; write outside it.
		l.mu.Lock()
		b := l.buf
		l.buf = spare[:0]
		l.room.Broadcast()
		l.mu.Unlock()
		if len(b) > 0 {
			l.out.Write(b)
		}
		spare = b
	}
}

// Write copies p into the buffer (or, once closed, into scratch space on its way out), so
// that p never escapes: a caller may hand it a buffer on its stack.
func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	for len(l.buf) >= logMaxBacklog && !l.closed {
		l.room.Wait()
	}
	if l.closed {
		defer l.mu.Unlock()
		l.scratch = append(l.scratch[:0], p...)
		return l.out.Write(l.scratch)
	}
	l.buf = append(l.buf, p...)
	full := len(l.buf) >= logFlushSize
	l.mu.Unlock()
	if full {
		select {
		case l.kick <- struct{}{}:
		default: // the flusher is told already
		}
	}
	return len(p), nil
}

// closeWithin is Close, but gives up after d: a destination that has stopped reading
// cannot be given a deadline, so the lines still waiting then are lost, and it says so.
func (l *logBuffer) closeWithin(d time.Duration) error {
	closed := make(chan error, 1)
	go func() { closed <- l.Close() }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case err := <-closed:
		return err
	case <-t.C:
		return fmt.Errorf("log: the log's destination stopped reading; lines not written within %v of the end were lost", d.Round(time.Millisecond))
	}
}

// Close stops the flusher and writes out what is buffered; later lines are written at once.
func (l *logBuffer) Close() error {
	l.mu.Lock()
	wasClosed := l.closed
	l.mu.Unlock()
	if !wasClosed {
		close(l.stop)
	}
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	l.room.Broadcast()
	b := l.buf
	l.buf = nil
	if len(b) == 0 {
		return nil
	}
	_, err := l.out.Write(b)
	return err
}

// ===== What needs no key: health, the document, and what no route serves =====

// serveHealth answers GET /v1/healthz and GET /healthz.
func (s *server) serveHealth(w http.ResponseWriter, r *http.Request, c *call) {
	writeBody(w, http.StatusOK, jsonContentType, s.health)
}

// openAPIDoc is the embedded OpenAPI document, prepared to be served with every servers
// entry (the top level's and any path's) naming the address that serves it: marked holds
// originMark where each entry's origin stands, and each answer replaces it with its own.
// It keeps the file's order of members: tools that send a request body's first example
// (Portman, Dredd, Prism) read them in the order served.
type openAPIDoc struct {
	marked []byte
}

// originMark stands for the serving origin in the prepared document.
const originMark = "http://origin.invalid"

func newOpenAPIDoc() (*openAPIDoc, error) {
	var doc struct {
		Servers []struct{ URL string }
		Paths   map[string]struct{ Servers []struct{ URL string } }
	}
	if err := json.Unmarshal(openAPIDocument, &doc); err != nil {
		return nil, fmt.Errorf("openapi.json: %w", err)
	}
	servers := doc.Servers
	for _, item := range doc.Paths {
		servers = append(servers, item.Servers...)
	}
	marked := openAPIDocument
	for _, s := range servers { // as the file writes a url member; a description's quotes are escaped
		u, err := url.Parse(s.URL)
		if err != nil {
			return nil, fmt.Errorf("openapi.json: server %q: %w", s.URL, err)
		}
		marked = bytes.ReplaceAll(marked, []byte(`"url": "`+s.URL+`"`), []byte(`"url": "`+originMark+u.Path+`"`))
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, marked); err != nil {
		return nil, fmt.Errorf("openapi.json: %w", err)
	}
	return &openAPIDoc{marked: compact.Bytes()}, nil
}

// serveOpenAPI answers GET /v1/openapi.json: the document, its servers at the address the
// request used.
func (s *server) serveOpenAPI(w http.ResponseWriter, r *http.Request, c *call) {
	writeBody(w, http.StatusOK, jsonContentType, bytes.ReplaceAll(s.openAPI.marked, []byte(originMark), []byte(originOf(r, s.origin))))
}

// routeNotFound answers a path that no route serves, naming the document and the page at
// the address the request used; a path outside /v1 is told that the operations are under it.
func (s *server) routeNotFound(w http.ResponseWriter, r *http.Request, c *call) {
	origin := originOf(r, s.origin)
	detail := "No operation is served at this path. Every operation is described in " + origin + "/v1/openapi.json; in a browser, " + origin + "/ shows the keys and fixtures."
	if p := r.URL.Path; p != "/v1" && !strings.HasPrefix(p, "/v1/") {
		detail = "No operation is served at this path. The operations are under " + origin + "/v1, each described in " + origin + "/v1/openapi.json; in a browser, " + origin + "/ shows the keys and fixtures."
	}
	c.fail(w, &apiError{code: codeRouteNotFound, detail: detail})
}

// methodNotAllowed answers 405 with the path's methods in Allow. When no browser is
// answered (no -cors-origin), a CORS preflight's detail says how to be.
func methodNotAllowed(methods []string, hintCORS bool) callHandler {
	allow := strings.Join(methods, ", ")
	detail := "This path answers " + methods[0] + " only."
	if last := len(methods) - 1; last > 0 {
		detail = "This path answers " + strings.Join(methods[:last], ", ") + " and " + methods[last] + " only."
	}
	err := &apiError{code: codeMethodNotAllowed, detail: detail}
	hinted := &apiError{code: codeMethodNotAllowed, detail: detail + " This is a browser's CORS preflight: start the sandbox with -cors-origin and your app's origin (such as -cors-origin http://localhost:3000) to let a browser app call it."}
	return func(w http.ResponseWriter, r *http.Request, c *call) {
		w.Header().Set("Allow", allow)
		if hintCORS && isPreflight(r) {
			c.fail(w, hinted)
			return
		}
		c.fail(w, err)
	}
}

// v1Root answers /v1 and /v1/, whatever the method: no operation is there; a person is
// sent to the page, a client to the document, at the address the request used.
func (s *server) v1Root(w http.ResponseWriter, r *http.Request, c *call) {
	origin := originOf(r, s.origin)
	c.fail(w, &apiError{code: codeRouteNotFound, detail: "No operation is served at " + r.URL.Path +
		" itself; the operations are under it. In a browser, open " + origin + "/ for the keys and fixtures; clients find every operation in " + origin + "/v1/openapi.json."})
}

// ===== The landing page =====

// GET /: what a person who opens the sandbox in a browser needs. It is bounded whatever
// the dataset: at most pageTenants tenants, and for each at most pageRows keys, shipments
// and orders, then a count of the rest; every value cut at pageValue bytes.

//go:embed landing.html
var landingHTML string

const (
	pageTenants  = 20
	pageRows     = 20
	pageValue    = 64
	pageRequests = 5   // a tenant's last journal entries
	pageFindings = 5   // and its first findings
	pageDetail   = 192 // a finding's detail is cut past this, as values are past pageValue
	// pageCountWait is how long after its arrival the page waits for the findings counts it
	// started aside; a count not done by then is shown as of the entry it was last made at.
	pageCountWait = 50 * time.Millisecond
)

// landing is the page's template and what it shows that does not depend on the request.
type landing struct {
	faults      string    // what -faults does, "" when it is off
	started     time.Time // the start instant
	page        *template.Template
	loopback    bool // the sandbox listens on loopback only: a loopback Host may see the keys
	tenants     []landingTenantKeys
	moreTenants int
}

// landingTenantKeys is a shown tenant with the keys the page may show of it.
type landingTenantKeys struct {
	t        *tenant
	name     template.HTML
	keys     []landingKey
	moreKeys int
	curlKey  string // the first key, for the example command
}

func newLanding(sb *sandbox, loopback bool, faults *faultPlan) *landing {
	l := &landing{page: template.Must(template.New("landing").Funcs(template.FuncMap{"count": groupDigits, "sub": func(a, b int) int { return a - b }}).Parse(landingHTML)), loopback: loopback, started: sb.start}
	if faults != nil {
		l.faults = faults.describe()
	}
	// The first key's tenant first, then the rest in the order the dataset declares them.
	order := sb.tenants.list
	if len(sb.keyLines) > 0 {
		first := sb.tenants.byID[sb.keyLines[0].tenant]
		order = append([]*tenant{first}, slices.DeleteFunc(slices.Clone(order), func(t *tenant) bool { return t == first })...)
	}
	shown := map[tenantID]int{}
	for i, t := range order[:min(len(order), pageTenants)] {
		shown[t.id] = i
		l.tenants = append(l.tenants, landingTenantKeys{t: t, name: cut(t.id.String())})
	}
	l.moreTenants = len(order) - len(l.tenants)
	for _, k := range sb.keyLines {
		i, ok := shown[k.tenant]
		if !ok {
			continue
		}
		if tk := &l.tenants[i]; len(tk.keys) < pageRows {
			if len(tk.keys) == 0 {
				tk.curlKey = boundValue(k.key, pageValue)
			}
			tk.keys = append(tk.keys, landingKey{cut(k.key), k.scopes, k.state})
		} else {
			tk.moreKeys++
		}
	}
	return l
}

// Page data, as the template reads it.
type (
	landingData struct {
		Origin, BaseURL string
		Started         string
		Faults          string // what -faults does, "" when it is off
		Sandboxes       int    // how many sandboxes tests made, never their keys
		ShowKeys        bool
		Curl            string
		Tenants         []landingTenant
		MoreTenants     int
	}
	landingKey struct {
		Key           template.HTML
		Scopes, State string
	}
	landingTenant struct {
		Name          template.HTML
		Now           string
		Offset        template.HTML
		Frozen        bool
		RunningFrom   string
		Keys          []landingKey
		MoreKeys      int
		Shipments     []landingShipment
		MoreShipments int
		Orders        []landingOrder
		MoreOrders    int
		Past, Future  []landingHappening
		MorePast      int
		MoreFuture    int
		Journal       bool // its journal is shown
		Requests      []landingRequest
		Journaled     int // the newest entry's seq: how many requests were journaled
		CountedTo     int // the seq up to which Findings counts: Journaled, unless a count runs aside
		Findings      int
		FirstFindings []landingFinding
		Runs          []landingRun // the runs of the requests shown, each judged apart
	}
	landingRun struct {
		Name template.HTML
		Link string // its findings, read with a key of the account
	}
	landingFinding struct {
		Code, Requests string
		ID, Detail     template.HTML
	}
	landingRequest struct {
		Seq            uint64
		At             string
		Method, Target template.HTML
		Status         int
	}
	landingHappening struct{ Offset, ID, What template.HTML }
	landingShipment  struct {
		ID, TrackingNumber template.HTML
		Status             string
		Shared             bool
		Dropped            int
	}
	landingOrder struct {
		ID                template.HTML
		Status, CreatedAt string
	}
)

// landingPage answers GET /: the page, each tenant as its clock, read once, shows it. Its
// links name the address the browser used; the keys are shown only to a loopback Host of a
// sandbox listening on loopback, so that a page under another name (DNS rebinding) shows none.
func (s *server) landingPage(w http.ResponseWriter, r *http.Request, c *call) {
	l := s.landing
	origin := originOf(r, s.origin)
	host, _, valid := splitHostPort(strings.ToLower(r.Host))
	d := landingData{Origin: origin, BaseURL: origin + "/v1", Started: formatTimestamp(l.started), Faults: l.faults, Sandboxes: s.book.count(s.now()),
		ShowKeys: l.loopback && valid && namesLoopback(host), MoreTenants: l.moreTenants}
	if d.ShowKeys && s.book.journaling() {
		s.awaitCounts(c.arrived.Add(pageCountWait))
	}
	for _, tk := range l.tenants {
		clock := tk.t.clock.read(s.now)
		now := clock.now
		if !clock.frozen {
			now = now.Truncate(time.Second) // a frozen clock is shown at the instant it was set to
		}
		lt := landingTenant{Name: tk.name, Now: formatTimestamp(now), Offset: fromStart(now, l.started), Frozen: clock.frozen}
		if clock.running {
			lt.RunningFrom = formatTimestamp(clock.runningFrom)
		}
		if d.ShowKeys {
			lt.Keys, lt.MoreKeys = tk.keys, tk.moreKeys
			if d.Curl == "" && len(tk.keys) > 0 {
				d.Curl = "curl -s -H 'Authorization: Bearer " + tk.curlKey + "' " + d.BaseURL + "/orders"
			}
			if s.book.journaling() && !tk.t.live {
				lt.Journal = true
				lt.Requests, lt.Journaled, lt.CountedTo, lt.Findings, lt.FirstFindings, lt.Runs = landingJournal(tk.t, d.BaseURL)
			}
		}
		td := tk.t.current()
		shipments, more := td.shipments.firstShown(clock.now, pageRows)
		for _, sh := range shipments {
			lt.Shipments = append(lt.Shipments, landingShipment{cut(sh.id), cut(sh.trackingNumber), sh.status, sh.shared, sh.dropped})
		}
		lt.MoreShipments = more
		orders, more := td.orders.firstListed(clock.now, pageRows)
		for _, o := range orders {
			lt.Orders = append(lt.Orders, landingOrder{cut(o.id), o.status, formatTimestamp(o.createdAt)})
		}
		lt.MoreOrders = more
		past, future, morePast, moreFuture := td.timelineAround(clock.now, timelineSide)
		for _, h := range past {
			lt.Past = append(lt.Past, landingHappening{fromStart(h.at, l.started), cut(h.id), cut(h.what())})
		}
		for _, h := range future {
			lt.Future = append(lt.Future, landingHappening{fromStart(h.at, l.started), cut(h.id), cut(h.what())})
		}
		lt.MorePast, lt.MoreFuture = morePast, moreFuture
		d.Tenants = append(d.Tenants, lt)
	}
	var b bytes.Buffer
	if err := l.page.Execute(&b, d); err != nil {
		s.writeError(w, c, err)
		return
	}
	writeBody(w, http.StatusOK, htmlContentType, b.Bytes())
}

// awaitCounts starts the findings count of each shown tenant's journal aside, and waits
// for them until deadline: the page shows what is counted by then.
func (s *server) awaitCounts(deadline time.Time) {
	var running []<-chan struct{}
	for _, tk := range s.landing.tenants {
		if done := tk.t.countFindings(); done != nil {
			running = append(running, done)
		}
	}
	if len(running) == 0 {
		return
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	for _, done := range running {
		select {
		case <-done:
		case <-t.C:
			return
		}
	}
}

// landingJournal is what the page shows of a tenant's journal: its last pageRequests
// entries, how many were journaled, its findings when the count was last made (up to
// which request): how many, and the first pageFindings (see tenant.countFindings); and the
// runs of the entries shown, whose findings are judged apart, each with its link under
// baseURL.
func landingJournal(t *tenant, baseURL string) ([]landingRequest, int, int, int, []landingFinding, []landingRun) {
	last := t.recentEntries(pageRequests)
	rows := make([]landingRequest, len(last))
	var runs []landingRun
	for i, e := range last {
		rows[i] = landingRequest{e.seq, time.Unix(0, e.arrived).UTC().Format("15:04:05.000"), cut(e.method), cut(e.target), int(e.status)}
		link := baseURL + "/test_helpers/findings?run=" + url.QueryEscape(e.runTag)
		if e.runTag != "" && !slices.ContainsFunc(runs, func(r landingRun) bool { return r.Link == link }) {
			runs = append(runs, landingRun{cut(e.runTag), link})
		}
	}
	newest, c := t.findingsCounted()
	var found []landingFinding
	for _, f := range c.first {
		seqs := make([]string, len(f.Requests))
		for i, seq := range f.Requests {
			seqs[i] = strconv.FormatUint(seq, 10)
		}
		lf := landingFinding{Code: f.Code, Requests: strings.Join(seqs, ", "), Detail: cutTo(f.Detail, pageDetail)}
		if f.ID != nil {
			lf.ID = cut(*f.ID)
		}
		found = append(found, lf)
	}
	return rows, int(newest), int(c.seq), c.n, found, runs
}

// cut is a shown value as the page writes it, HTML-escaped and bounded by what is written:
// when its escaped form is over pageValue bytes, it is the longest beginning whose escaped
// form fits pageValue-3 bytes, then "...". A value with nothing to escape is thus cut to
// its first 61 bytes (at a UTF-8 boundary), and one full of & to 11 of them (&amp; each):
// the page's bound holds whatever the values hold.
func cut(s string) template.HTML { return cutTo(s, pageValue) }

// cutTo is cut at limit bytes rather than pageValue.
func cutTo(s string, limit int) template.HTML {
	escaped := html.EscapeString(s)
	if len(escaped) <= limit {
		return template.HTML(escaped)
	}
	var b strings.Builder
	for _, r := range s {
		e := html.EscapeString(string(r))
		if b.Len()+len(e) > limit-3 {
			break
		}
		b.WriteString(e)
	}
	return template.HTML(b.String() + "...")
}

// fromStart is at's offset from the start instant as relative instants write it (+1m30s,
// -10m0s: exact, to the nanosecond), or "" past what a duration holds (some 292 years).
func fromStart(at, start time.Time) template.HTML {
	d := at.Sub(start)
	switch {
	case d == math.MaxInt64 || d == math.MinInt64:
		return ""
	case d < 0:
		return template.HTML(d.String())
	}
	return template.HTML("+" + d.String())
}

// groupDigits writes n with its digits grouped by commas: 99,980.
func groupDigits(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// ===== Conformance: the command, its flags and its run =====

// The conformance kit (go run . check): the spec's rules, each a named check made over HTTP
// as any client would make it, against any server that claims the API: the live API on the
// day it opens, a partner's implementation, another build of this sandbox, or, without
// -base-url, this one, started in this process. It judges data it makes where the server
// makes sandboxes (its own world), else what its keys can read (a discovered world). It
// carries keys to a server it does not trust: it follows no redirect, sends keys only to
// the base URL's host, reads at most 1 MiB of an answer, and bounds each request by
// -timeout; no report or message ever holds a key.

// Exit statuses of the kit.
const (
	checkPassed      = 0   // no MUST rule failed (but as expected)
	checkFailed      = 1   // a MUST rule failed (with -strict, any rule)
	checkCannotJudge = 2   // a usage error, or a server it could not judge
	checkInterrupted = 130 // SIGINT or SIGTERM: its sandboxes deleted
)

// checkFlagRoles are the key flags, in the order -h lists them, and the role of each.
var checkFlagRoles = []struct {
	flag string
	role keyRole
	what string
}{
	{"key", roleMain, "a test `key` with both scopes (required with -base-url)"},
	{"alt-key", roleAlt, "a test `key` of another account, both scopes"},
	{"tracking-key", roleTracking, "a test `key` with tracking:read only"},
	{"orders-key", roleOrders, "a test `key` with orders:read only"},
	{"expired-key", roleExpired, "an expired test `key`"},
	{"revoked-key", roleRevoked, "a revoked test `key`"},
}

// parseCheckConfig reads check's flags, then SANDBOX_CHECK_<NAME> for each not given. A
// fault names the flag or the variable.
func parseCheckConfig(args []string, getenv func(string) string, usage io.Writer) (checkConfig, error) {
	cfg := checkConfig{keys: map[keyRole]string{}, profile: "sandbox", format: "text", timeout: 10 * time.Second}
	var mode, rules, expectFile string
	fs := flag.NewFlagSet("sandbox check", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&cfg.baseURL, "base-url", "", "the server under check: an absolute http or https `URL` whose path ends in /v1 (default: this sandbox, started in this process)")
	for _, k := range checkFlagRoles {
		fs.Func(k.flag, k.what, func(v string) error { cfg.keys[k.role] = v; return nil })
	}
	fs.StringVar(&cfg.profile, "profile", cfg.profile, "the spec's stated difference to expect: `sandbox` or domain_adapter")
	fs.StringVar(&rules, "rules", "", "comma-separated rule `ids`, or prefixes ending in * such as tracking.* (default: every rule)")
	fs.StringVar(&mode, "mode", "", "`safe`, or full to add the rules that load the server (default safe; full for the self-check)")
	fs.StringVar(&expectFile, "expect", "", "a JSON `file` of known differences, rule id to reason: such a rule that fails is expected")
	fs.StringVar(&cfg.format, "format", cfg.format, "the report's `format`: text, json or junit")
	fs.StringVar(&cfg.out, "out", "", "write the report to this `file` (default: standard output)")
	fs.DurationVar(&cfg.timeout, "timeout", cfg.timeout, "the longest one request may take, answer read, as a Go `duration`")
	fs.BoolVar(&cfg.strict, "strict", false, "a failed SHOULD rule fails the run too")
	given, err := parseFlags(fs, args, usage, "Usage: sandbox check [flags]: the spec's rules, checked over HTTP against a server (without -base-url, this sandbox). Each flag falls back to SANDBOX_CHECK_<NAME> (e.g. SANDBOX_CHECK_KEY). Exit status: 0 no MUST rule failed, 1 one did, 2 the kit could not judge, 130 interrupted.", "check", "check -h")
	if err != nil {
		return cfg, err
	}
	if err := fallBack(fs, given, getenv, "SANDBOX_CHECK_"); err != nil {
		return cfg, err
	}
	name := func(flag string) string { // what the user set a value with
		if given[flag] {
			return "-" + flag
		}
		return "SANDBOX_CHECK_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
	}
	if cfg.baseURL != "" {
		u, err := url.Parse(cfg.baseURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || !strings.HasSuffix(strings.TrimSuffix(u.Path, "/"), "/v1") || u.RawQuery != "" || u.Fragment != "" {
			return cfg, fmt.Errorf("%s %q: want an absolute http or https URL whose path ends in /v1, such as http://127.0.0.1:8080/v1", name("base-url"), cfg.baseURL)
		}
		if cfg.keys[roleMain] == "" {
			return cfg, errors.New("-key: a test key with both scopes is required with -base-url (or SANDBOX_CHECK_KEY)")
		}
	}
	if cfg.baseURL == "" && cfg.keys[roleMain] == "" {
		cfg.keys[roleMain] = "sk_test_sandbox_all"
	}
	for role, key := range cfg.keys {
		if !isBearerToken(key) {
			for _, k := range checkFlagRoles {
				if k.role == role {
					return cfg, fmt.Errorf("%s: not sendable as a Bearer credential: letters, digits and - . _ ~ + / (then = padding only)", name(k.flag))
				}
			}
		}
	}
	if cfg.profile != "sandbox" && cfg.profile != "domain_adapter" {
		return cfg, fmt.Errorf("%s %q: want sandbox or domain_adapter", name("profile"), cfg.profile)
	}
	switch mode {
	case "":
		cfg.full = cfg.baseURL == ""
	case "safe", "full":
		cfg.full = mode == "full"
	default:
		return cfg, fmt.Errorf("%s %q: want safe or full", name("mode"), mode)
	}
	if cfg.format != "text" && cfg.format != "json" && cfg.format != "junit" {
		return cfg, fmt.Errorf("%s %q: want text, json or junit", name("format"), cfg.format)
	}
	if cfg.timeout <= 0 {
		return cfg, fmt.Errorf("%s %v: want a positive duration such as 10s", name("timeout"), cfg.timeout)
	}
	if rules != "" {
		cfg.rules = strings.Split(rules, ",")
		for _, r := range cfg.rules {
			if len(rulesNamed(r)) == 0 {
				return cfg, fmt.Errorf("%s: %q names no rule (check -h; the rules are listed in docs/conformance.md)", name("rules"), r)
			}
		}
	}
	if expectFile != "" {
		b, err := os.ReadFile(expectFile)
		if err == nil {
			err = json.Unmarshal(b, &cfg.expect)
		}
		if err != nil {
			return cfg, fmt.Errorf("%s %s: want a JSON object of rule id to reason: %v", name("expect"), expectFile, err)
		}
		for id := range cfg.expect {
			if len(rulesNamed(id)) == 0 {
				return cfg, fmt.Errorf("%s %s: %q names no rule", name("expect"), expectFile, id)
			}
		}
	}
	return cfg, nil
}

// runCheck is the kit's whole program: its flags, the server (this sandbox, started here,
// without -base-url), the run, the report, and its exit status. A signal stops the run,
// deletes the kit's sandboxes and exits 130 within 5 s.
func runCheck(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	cfg, err := parseCheckConfig(args, getenv, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return checkPassed
	}
	if err != nil {
		fmt.Fprintln(stderr, "sandbox check: "+err.Error())
		return checkCannotJudge
	}
	if cfg.baseURL == "" {
		base, stop, err := startSelfCheck()
		if err != nil {
			fmt.Fprintln(stderr, "sandbox check: starting this sandbox: "+err.Error())
			return checkCannotJudge
		}
		defer stop()
		cfg.baseURL = base
	}
	k := newKit(ctx, cfg)
	rep, err := k.run()
	if ctx.Err() != nil {
		fmt.Fprintln(stderr, "sandbox check: interrupted: the kit's sandboxes are deleted")
		return checkInterrupted
	}
	if err != nil {
		fmt.Fprintln(stderr, "sandbox check: "+k.redact(err.Error()))
		return checkCannotJudge
	}
	out := stdout
	if cfg.out != "" {
		f, err := os.Create(cfg.out)
		if err != nil {
			fmt.Fprintln(stderr, "sandbox check: -out: "+err.Error())
			return checkCannotJudge
		}
		defer f.Close()
		out = f
	}
	if err := rep.write(out, cfg.format); err != nil {
		fmt.Fprintln(stderr, "sandbox check: writing the report: "+err.Error())
		return checkCannotJudge
	}
	switch {
	case rep.Summary.FailedMust > 0, cfg.strict && rep.Summary.Failed > 0:
		return checkFailed
	}
	return checkPassed
}

// startSelfCheck starts this sandbox in this process, as go run . serves it (the default
// dataset, the default flags) but on a free loopback port, and returns its base URL.
func startSelfCheck() (string, func(), error) {
	cfg := defaultConfig()
	quiet := slog.New(slog.DiscardHandler)
	sb, err := loadDataset(defaultDatasetName, bytes.NewReader(defaultDataset), 0, time.Now().UTC().Truncate(time.Second), quiet)
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	base := baseURL(ln.Addr())
	srv, err := newServer(sb, serverOptions{rate: cfg.rate, baseURL: base, log: quiet, loopback: true, journal: cfg.journal})
	if err != nil {
		ln.Close()
		return "", nil, err
	}
	hs := newHTTPServer(cfg, srv.handler(), quiet)
	go hs.Serve(ln)
	return base, func() { hs.Close() }, nil
}

// ===== Conformance: the catalogue and the run =====

// ruleLevel is how binding a rule is: MUST, a sentence of the spec; SHOULD, a decision of
// the sandbox's contract where the spec says "not shown".
type ruleLevel string

const (
	levelMust   ruleLevel = "MUST"
	levelShould ruleLevel = "SHOULD"
)

// conformanceRule is one rule of the catalogue: its stable id (users name it in -rules, in
// -expect files and on dashboards), its level, its title, the words it rests on, and its
// check, which lives beside what it checks.
type conformanceRule struct {
	id, title string
	level     ruleLevel
	adapter   ruleLevel // its level with -profile domain_adapter, when another
	spec      string    // the spec's words (MUST), or the contract's sentence (SHOULD)
	judge     func(k *kit) ruleVerdict
	every     bool // it judges the answers of the rules run, not requests of its own
	load      bool // it loads the server: -mode full only
}

// levelFor is the rule's level under the profile.
func (r *conformanceRule) levelFor(profile string) ruleLevel {
	if profile == "domain_adapter" && r.adapter != "" {
		return r.adapter
	}
	return r.level
}

// rulesNamed are the rules an id, or a prefix ending in *, names.
func rulesNamed(name string) []*conformanceRule {
	var named []*conformanceRule
	for i := range conformanceRules {
		r := &conformanceRules[i]
		if prefix, ok := strings.CutSuffix(name, "*"); ok && strings.HasPrefix(r.id, prefix) || r.id == name {
			named = append(named, r)
		}
	}
	return named
}

// conformanceRules is the catalogue, in the order reports list it: the rules the spec's
// sentences make (MUST), then those the sandbox's contract decides where the spec says "not
// shown" (SHOULD). The ids are stable: users name them in -rules, -expect files and
// dashboards. docs/conformance.md lists them (TestTheCatalogueIsOneTable).
var conformanceRules = []conformanceRule{
	{id: "auth.missing_key", level: levelMust, title: "no key: 401 on each of the four operations", judge: judgeMissingKey,
		spec: "Every request carries the header Authorization with an API key as a bearer credential. A missing, invalid, expired or revoked key returns 401."},
	{id: "auth.invalid_key", level: levelMust, title: "an unknown key: 401", judge: judgeInvalidKey,
		spec: "A missing, invalid, expired or revoked key returns 401."},
	{id: "auth.expired_key", level: levelMust, title: "an expired key: 401", judge: judgeKeyRole(roleExpired, "-expired-key", codeExpiredAPIKey),
		spec: "A missing, invalid, expired or revoked key returns 401."},
	{id: "auth.revoked_key", level: levelMust, title: "a revoked key: 401", judge: judgeKeyRole(roleRevoked, "-revoked-key", codeRevokedAPIKey),
		spec: "A missing, invalid, expired or revoked key returns 401."},
	{id: "auth.scope_tracking", level: levelMust, title: "a key without tracking:read: 403 on both tracking operations", judge: judgeScope(roleOrders, "-orders-key (a key without tracking:read)", func(k *kit) []string { return k.operationTargets()[:2] }),
		spec: "A key lacking the required scope returns 403. Scopes used: tracking:read (both tracking endpoints), orders:read (both order endpoints)."},
	{id: "auth.scope_orders", level: levelMust, title: "a key without orders:read: 403 on both order operations", judge: judgeScope(roleTracking, "-tracking-key (a key without orders:read)", func(k *kit) []string { return k.operationTargets()[2:] }),
		spec: "A key lacking the required scope returns 403. Scopes used: tracking:read (both tracking endpoints), orders:read (both order endpoints)."},
	{id: "auth.other_account", level: levelMust, title: "another account's key reading this account's order, shipment and tracking number: 404 each", judge: judgeOtherAccount,
		spec: "Keys and scopes are tied to an account and an environment; resources of another account or environment are reported as 404."},
	{id: "tracking.view_fields", level: levelMust, title: "the view's five fields and each event's four, with their types", judge: judgeViewFields,
		spec: "shipment_id, reference, tracking_number (string or null), status, events: required; each event's status, description, timestamp, and location: \"Display location; empty string when none\"."},
	{id: "tracking.utc", level: levelMust, title: "every timestamp ISO 8601 in UTC with the suffix Z", judge: judgeUTC,
		spec: "All timestamps are ISO 8601 with timezone. Responses use UTC with the suffix Z."},
	{id: "tracking.by_number", level: levelMust, title: "a number one shipment holds finds the same view as its id", judge: judgeByNumber,
		spec: "Lookup is account-scoped and matches the primary tracking number only. Response 200: the tracking view of a shipment (same shape as above)."},
	{id: "tracking.primary_number_only", level: levelMust, title: "a further parcel's number: 404", judge: judgePrimaryNumberOnly,
		spec: "Lookup is account-scoped and matches the primary tracking number only."},
	{id: "tracking.unknown", level: levelMust, title: "an unknown shipment id and an unknown number: 404", judge: judgeTrackingUnknown,
		spec: "Unknown shipment in this account and environment: 404. Unknown number: 404 in both the sandbox and the unreleased domain adapter."},
	{id: "tracking.ambiguous_number", level: levelMust, title: "a number two shipments hold: 404 (409 with -profile domain_adapter)", judge: judgeAmbiguousNumber,
		spec: "Ambiguous number: the local sandbox returns 404; the unreleased domain adapter returns 409."},
	{id: "tracking.dedup", level: levelMust, title: "no two events of one instant and description", judge: judgeDedup,
		spec: "Events with equivalent instants and descriptions are deduplicated; duplicates are suppressed."},
	{id: "tracking.no_offset", level: levelMust, title: "an event without an offset is not shown", judge: judgeNoOffset,
		spec: "Input timestamps without timezone are not interpreted (not assumed to be UTC); such events are excluded."},
	{id: "tracking.utc_across_dst", level: levelMust, title: "events across a UK daylight-saving change shown at their instants in UTC, in order", judge: judgeUTCAcrossDST,
		spec: "UTC instants are preserved across UK daylight-saving changes."},
	{id: "orders.fields", level: levelMust, title: "the six fields with their types, created_at in UTC, a platform of the five, no marketplace data", judge: judgeOrderFields,
		spec: "id, merchant_reference, platform (one of five marketplace platform identifiers), status, shipment_id (string or null), created_at (ISO 8601, UTC Z). Marketplace tokens and raw marketplace data are never part of the resource."},
	{id: "orders.retrieve", level: levelMust, title: "an order read by id equals the listed one", judge: judgeRetrieve,
		spec: "Response 200: one imported order."},
	{id: "orders.unknown", level: levelMust, title: "an unknown order: 404", judge: judgeOrderUnknown,
		spec: "Unknown order in this account and environment: 404."},
	{id: "orders.default_limit", level: levelMust, title: "limit 20 when none is sent: at most 20 orders, 20 when more exist", judge: judgePageSize("", defaultPageSize, "limit 20 when none is sent: at most 20 orders, 20 when more follow"),
		spec: "limit: Page size; default 20; maximum 100."},
	{id: "orders.max_limit", level: levelMust, title: "limit=100: at most 100 orders", judge: judgePageSize("?limit=100", maxPageSize, "limit=100 applied: at most 100 orders, 100 when more follow"),
		spec: "limit: Page size; default 20; maximum 100."},
	{id: "orders.pagination", level: levelMust, title: "limit at least 1; has_more false exactly when next_cursor is null", judge: judgePagination,
		spec: "limit: integer (minimum 1). next_cursor: Opaque signed cursor for the next page; null when none. has_more: Whether more results follow."},
	{id: "orders.cursor_walk", level: levelMust, title: "following next_cursor shows each order once", judge: judgeCursorWalk,
		spec: "cursor: Opaque signed next_cursor from a previous page; the same filters must be kept between pages."},
	{id: "orders.malformed_cursor", level: levelMust, title: "a malformed cursor: 400", judge: judgeMalformedCursor,
		spec: "Malformed cursor: 400."},
	{id: "orders.filter_status", level: levelMust, title: "status: only orders of that status", judge: judgeFilterStatus,
		spec: "status: Exact match on normalized status."},
	{id: "orders.filter_created", level: levelMust, title: "created_from and created_to inclusive: the orders at exactly those instants included, none outside", judge: judgeFilterCreated,
		spec: "created_from: Inclusive lower bound on creation time. created_to: Inclusive upper bound on creation time."},
	{id: "orders.linked_shipment", level: levelMust, title: "an order's shipment_id finds a tracking view", judge: judgeLinkedShipment,
		spec: "shipment_id: Linked shipment ID; null when no shipment is linked."},
	{id: "http.method_not_allowed", level: levelMust, title: "POST, PUT, PATCH and DELETE on each operation: 405", judge: judgeMethodNotAllowed,
		spec: "Every operation below is a GET without a request body. 405: Method not supported."},
	{id: "http.body_too_large", level: levelMust, title: "a body of 256 KiB + 1 byte: 413", judge: judgeBodyTooLarge,
		spec: "Request body size: 256 KiB; larger returns 413."},
	{id: "limits.rate_limit", level: levelMust, adapter: levelShould, title: "past the rate limit: 429", judge: judgeRateLimit, load: true,
		spec: "Rate limit: enforced in the sandbox; exceeding returns 429."},
	{id: "tracking.exact_fields", level: levelShould, title: "no member of a view or an event beyond the spec's", judge: judgeTrackingExactFields,
		spec: "No member beyond the spec's: a tracking view is shipment_id, reference, tracking_number, status and events; an event, status, description, timestamp and location."},
	{id: "orders.exact_fields", level: levelShould, title: "no member of an order or a page beyond the spec's", judge: judgeOrderExactFields,
		spec: "The stored orders carry a marketplace token and a raw marketplace payload, as imported orders do; the resource never shows either (exactly the six spec fields)."},
	{id: "errors.problem_json", level: levelShould, title: "every error application/problem+json with type, title, status, detail, code and request_id", judge: judgeProblemJSON, every: true,
		spec: "Every error body is RFC 9457 problem details, Content-Type: application/problem+json, with the code and the request id."},
	{id: "errors.codes", level: levelShould, title: "each error the kit made has its documented code", judge: judgeCodes, every: true,
		spec: "401 missing_api_key, invalid_api_key, expired_api_key, revoked_api_key; 403 insufficient_scope; 404 not_found; 405 method_not_allowed; 413 body_too_large; 400 invalid_cursor; 422 invalid_parameter; 409 ambiguous_tracking_number (the domain adapter)."},
	{id: "orders.order", level: levelShould, title: "newest first: created_at, then id, descending", judge: judgeOrderOrder,
		spec: "Order: newest first, created_at descending, then id descending."},
	{id: "orders.limit_range", level: levelShould, title: "limit 0 and 101: 422 invalid_parameter limit", judge: judgeLimitRange,
		spec: "limit: integer 1..100; a bad value (limit 0, 101): 422 invalid_parameter, naming the parameter in param."},
	{id: "orders.cursor_filters", level: levelShould, title: "a cursor sent with other filters: 400 invalid_cursor", judge: judgeCursorFilters,
		spec: "A cursor that does not decode, is not signed by this server, belongs to another account/environment or is used with other filters: 400 invalid_cursor."},
	{id: "http.request_id", level: levelShould, title: "a Request-Id on every answer", judge: judgeRequestID, every: true,
		spec: "Every response: Request-Id header (req_ + random)."},
	{id: "http.no_store", level: levelShould, title: "Cache-Control: no-store on every answer", judge: judgeNoStore, every: true,
		spec: "Every response: Cache-Control: no-store on /v1 responses."},
	{id: "limits.rate_limit_headers", level: levelShould, title: "RateLimit-Policy and RateLimit on answers, Retry-After on the 429", judge: judgeRateLimitHeaders, load: true,
		spec: "While a rate limit is set, answers that passed the rate limiter (and 429s) carry its state in the IETF draft's structured fields; 429 rate_limited with Retry-After in whole seconds."},
	{id: "tracking.vocabulary", level: levelShould, title: "every status of the tracking vocabulary", judge: judgeTrackingVocabulary,
		spec: "Tracking status (shipment status, events[].status): pre_transit, in_transit, out_for_delivery, available_for_pickup, delivered, return_to_sender, failure, cancelled, unknown."},
	{id: "tracking.events_oldest_first", level: levelShould, title: "events oldest first", judge: judgeEventsOldestFirst,
		spec: "Events are ordered oldest first (stable for equal instants)."},
	{id: "orders.vocabulary", level: levelShould, title: "every order status of the vocabulary", judge: judgeOrderVocabulary,
		spec: "Order status: unfulfilled, partially_fulfilled, fulfilled, cancelled."},
}

// run judges the selected rules: the first read, the world, each rule's check in the
// catalogue's order (those that load the server last), then the rules that judge every
// answer; it deletes the kit's sandboxes before it returns, whatever happened.
func (k *kit) run() (*checkReport, error) {
	defer k.deleteSandboxes()
	if err := k.firstRead(); err != nil {
		return nil, err
	}
	k.rule = "(world)"
	k.world = k.makeWorld()
	selected := map[string]bool{}
	for _, name := range k.cfg.rules {
		for _, r := range rulesNamed(name) {
			selected[r.id] = true
		}
	}
	onlyEvery := len(selected) > 0
	for id := range selected {
		onlyEvery = onlyEvery && slices.ContainsFunc(conformanceRules, func(r conformanceRule) bool { return r.id == id && r.every })
	}
	chosen := func(r *conformanceRule) bool { return len(selected) == 0 || selected[r.id] }
	verdicts := map[string]ruleVerdict{}
	for _, pass := range []bool{false, true} { // the rules that load the server last
		for i := range conformanceRules {
			r := &conformanceRules[i]
			if r.every || r.load != pass || !chosen(r) && !onlyEvery {
				continue
			}
			if k.ctx.Err() != nil {
				return nil, k.ctx.Err()
			}
			if r.load && !k.cfg.full {
				verdicts[r.id] = skip("it loads the server: run with -mode full")
				continue
			}
			k.rule = r.id
			verdicts[r.id] = r.judge(k).settled()
		}
	}
	for i := range conformanceRules {
		if r := &conformanceRules[i]; r.every && chosen(r) {
			k.judged = k.judged[:0]
			for _, other := range conformanceRules {
				if !other.every && (onlyEvery || chosen(&other)) {
					k.judged = append(k.judged, k.used[other.id]...)
				}
			}
			k.rule = r.id
			verdicts[r.id] = r.judge(k).settled()
		}
	}
	if k.ctx.Err() != nil {
		return nil, k.ctx.Err()
	}
	return k.report(verdicts, chosen), nil
}

// firstRead makes the kit's first request, GET {base}/orders?limit=1 with -key: a server it
// cannot reach, or whose answer says the key is refused or this is not the API, cannot be
// judged (exit status 2). A 429 is waited out.
func (k *kit) firstRead() error {
	k.rule = "(first read)"
	ex := k.get(roleMain, "/orders?limit=1", http.StatusOK, "")
	target := k.base.String() + "/orders?limit=1"
	switch {
	case k.ctx.Err() != nil:
		return k.ctx.Err()
	case ex.err != nil && ex.status == 0:
		return fmt.Errorf("the base URL %s cannot be reached, or does not answer HTTP within -timeout %v: %v", k.base, k.cfg.timeout, ex.err)
	case ex.status == http.StatusUnauthorized:
		return fmt.Errorf("the first read, GET %s with -key, answered 401: the key is refused (unknown, expired or revoked; a test key of this server is needed)", target)
	case ex.status == http.StatusForbidden:
		return fmt.Errorf("the first read, GET %s with -key, answered 403: the key lacks a scope (-key needs tracking:read and orders:read)", target)
	case ex.status == http.StatusNotFound:
		return fmt.Errorf("the first read, GET %s, answered 404: this is not the API (the base URL is the API's, ending in /v1)", target)
	case !json.Valid(ex.body) || !bytes.HasPrefix(bytes.TrimSpace(ex.body), []byte("{")):
		return fmt.Errorf("the first read, GET %s, answered %d with a body that is not JSON: this is not the API", target, ex.status)
	}
	return nil
}

// ===== Conformance: every answer, the methods and the body =====

// The kit's rules of HTTP itself: the methods and the body of every operation, and what
// every answer carries.

func judgeMethodNotAllowed(k *kit) ruleVerdict {
	var v ruleVerdict
	for _, target := range k.operationTargets() {
		for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} { // no body: a write is never meant
			ex := k.send(request{method: method, target: target, role: roleMain, expect: expectation{http.StatusMethodNotAllowed, codeMethodNotAllowed}})
			v.wantStatus(k, ex, http.StatusMethodNotAllowed, method+" on an operation that answers GET")
		}
	}
	return v
}

func judgeBodyTooLarge(k *kit) ruleVerdict {
	var v ruleVerdict
	ex := k.send(request{method: http.MethodGet, target: "/orders", role: roleMain, body: bytes.Repeat([]byte("x"), maxBodyBytes+1), expect: expectation{http.StatusRequestEntityTooLarge, codeBodyTooLarge}})
	v.wantStatus(k, ex, http.StatusRequestEntityTooLarge, "a body of 256 KiB + 1 byte")
	return v
}

func judgeRequestID(k *kit) ruleVerdict {
	var v ruleVerdict
	for _, ex := range k.judged {
		if ex.status != 0 && ex.header.Get("Request-Id") == "" {
			v.fail(k, ex, "a Request-Id on every answer", "none")
			break
		}
	}
	return v
}

func judgeNoStore(k *kit) ruleVerdict {
	var v ruleVerdict
	for _, ex := range k.judged {
		if ex.status != 0 && !strings.Contains(ex.header.Get("Cache-Control"), "no-store") {
			v.fail(k, ex, "Cache-Control: no-store on every answer", fmt.Sprintf("Cache-Control %q", ex.header.Get("Cache-Control")))
			break
		}
	}
	return v
}

// ===== Conformance: the reports =====

// checkReport is a run's report, as its JSON writes it: members in this order.
type checkReport struct {
	BaseURL  string        `json:"base_url"`
	Profile  string        `json:"profile"`
	Mode     string        `json:"mode"`
	World    string        `json:"world"`
	Warnings []string      `json:"warnings"`
	Rules    []ruleReport  `json:"rules"`
	Summary  reportSummary `json:"summary"`
}

type ruleReport struct {
	ID       string          `json:"id"`
	Level    ruleLevel       `json:"level"`
	Title    string          `json:"title"`
	Spec     string          `json:"spec"`
	Result   string          `json:"result"`
	Reason   *string         `json:"reason"`
	Evidence []checkEvidence `json:"evidence"`
}

type reportSummary struct {
	Total      int `json:"total"`
	Passed     int `json:"passed"`
	Failed     int `json:"failed"`
	FailedMust int `json:"failed_must"`
	Skipped    int `json:"skipped"`
	Expected   int `json:"expected"`
	Evaluated  int `json:"evaluated"`
	Requests   int `json:"requests"`
	Retried    int `json:"retried"`
}

// report is the run's report of the chosen rules, in the catalogue's order, with -expect
// applied: a failure it names is expected; a pass it names says the expectation can go.
func (k *kit) report(verdicts map[string]ruleVerdict, chosen func(*conformanceRule) bool) *checkReport {
	rep := &checkReport{BaseURL: k.base.String(), Profile: k.cfg.profile, Mode: "safe", World: "discovered", Warnings: k.warnings(), Rules: []ruleReport{}}
	if k.cfg.full {
		rep.Mode = "full"
	}
	if k.world != nil && k.world.own {
		rep.World = "own"
	}
	for i := range conformanceRules {
		r := &conformanceRules[i]
		if !chosen(r) {
			continue
		}
		v := verdicts[r.id]
		expected, named := "", false
		for name, reason := range k.cfg.expect {
			if slices.Contains(rulesNamed(name), r) {
				expected, named = reason, true
			}
		}
		switch {
		case named && v.failed():
			v.result, v.reason = "expected", expected
		case named && v.result == "pass":
			v.reason = "expected to fail (" + expected + "), but passes: the expectation can go"
		}
		rr := ruleReport{ID: r.id, Level: r.levelFor(k.cfg.profile), Title: r.title, Spec: r.spec, Result: v.result, Evidence: v.evidence}
		if rr.Evidence == nil {
			rr.Evidence = []checkEvidence{}
		}
		if v.reason != "" {
			reason := k.redact(v.reason)
			rr.Reason = &reason
		}
		rep.Rules = append(rep.Rules, rr)
		s := &rep.Summary
		s.Total++
		switch v.result {
		case "pass":
			s.Passed++
		case "fail":
			s.Failed++
			if rr.Level == levelMust {
				s.FailedMust++
			}
		case "skip":
			s.Skipped++
		case "expected":
			s.Expected++
		}
	}
	rep.Summary.Evaluated = rep.Summary.Total - rep.Summary.Skipped
	rep.Summary.Requests, rep.Summary.Retried = int(k.requests.Load()), k.retried
	return rep
}

// warnings are what would make a pass meaningless: most of the reads the kit expected to
// succeed were refused (401, 403, 429) or failed (5xx).
func (k *kit) warnings() []string {
	warnings := []string{}
	reads, refused := 0, map[int]int{}
	for _, exs := range k.used {
		for _, ex := range exs {
			if ex.req.expect.status == http.StatusOK {
				reads++
				if ex.status == http.StatusUnauthorized || ex.status == http.StatusForbidden || ex.status == http.StatusTooManyRequests || ex.status >= 500 {
					refused[ex.status]++
				}
			}
		}
	}
	n := 0
	var counts []string
	for _, status := range slices.Sorted(maps.Keys(refused)) {
		n += refused[status]
		counts = append(counts, fmt.Sprintf("%d: %d", status, refused[status]))
	}
	if reads > 0 && 2*n > reads {
		warnings = append(warnings, fmt.Sprintf("%d of the %d reads the kit expected to succeed were refused or failed (%s): a rule that passed on them judged little; check the keys (-key and the others), the rate limit and the environment (a live key answers 503 while live is not released)", n, reads, strings.Join(counts, ", ")))
	}
	return warnings
}

// write writes the report in format: text, json or junit.
func (rep *checkReport) write(w io.Writer, format string) error {
	switch format {
	case "json":
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		_, err = w.Write(append(b, '\n'))
		return err
	case "junit":
		return rep.writeJUnit(w)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Conformance of %s (profile %s, mode %s, world %s)\n", rep.BaseURL, rep.Profile, rep.Mode, rep.World)
	for _, warning := range rep.Warnings {
		fmt.Fprintf(&b, "WARNING %s\n", warning)
	}
	marks := map[string]string{"pass": "PASS", "fail": "FAIL", "skip": "SKIP", "expected": "XFAIL"}
	for _, r := range rep.Rules {
		fmt.Fprintf(&b, "%-5s %s  %s", marks[r.Result], r.ID, r.Title)
		if r.Reason != nil {
			fmt.Fprintf(&b, " (%s)", *r.Reason)
		}
		b.WriteString("\n")
		if r.Result != "fail" {
			continue
		}
		for _, e := range r.Evidence {
			fmt.Fprintf(&b, "      expected: %s\n      seen: %s\n      %s\n", e.Expected, e.Seen, e.Curl)
			if e.RequestID != "" {
				fmt.Fprintf(&b, "      request id: %s\n", e.RequestID)
			}
		}
	}
	s := rep.Summary
	fmt.Fprintf(&b, "%d rules: %d passed, %d failed (%d MUST), %d skipped, %d expected; evaluated %d of %d\n", s.Total, s.Passed, s.Failed, s.FailedMust, s.Skipped, s.Expected, s.Evaluated, s.Total)
	_, err := io.WriteString(w, b.String())
	return err
}

// writeJUnit writes the report as one JUnit test suite: a test case a rule (its class the
// id's part before the dot), a failure with its evidence, a skip, and an expected failure
// as a skip that says so.
func (rep *checkReport) writeJUnit(w io.Writer) error {
	var b strings.Builder
	s := rep.Summary
	fmt.Fprintf(&b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuite name=\"conformance\" tests=\"%d\" failures=\"%d\" skipped=\"%d\">\n", s.Total, s.Failed, s.Skipped+s.Expected)
	attr := func(v string) string { return html.EscapeString(strings.ToValidUTF8(v, "?")) }
	for _, r := range rep.Rules {
		class, _, _ := strings.Cut(r.ID, ".")
		fmt.Fprintf(&b, "  <testcase classname=\"%s\" name=\"%s\">", attr(class), attr(r.ID))
		switch r.Result {
		case "fail":
			var text strings.Builder
			for _, e := range r.Evidence {
				fmt.Fprintf(&text, "expected: %s\nseen: %s\n%s\nrequest id: %s\n", e.Expected, e.Seen, e.Curl, e.RequestID)
			}
			fmt.Fprintf(&b, "\n    <failure message=\"%s: %s\">%s</failure>\n  ", attr(string(r.Level)), attr(r.Title), attr(text.String()))
		case "skip":
			fmt.Fprintf(&b, "\n    <skipped message=\"%s\"/>\n  ", attr(*r.Reason))
		case "expected":
			fmt.Fprintf(&b, "\n    <skipped message=\"expected failure: %s\"/>\n  ", attr(*r.Reason))
		}
		b.WriteString("</testcase>\n")
	}
	b.WriteString("</testsuite>\n")
	_, err := io.WriteString(w, b.String())
	return err
}
