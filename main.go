// Command sandbox serves the local sandbox of the Shipment Tracking and Imported Orders API,
// opens it to coding agents (POST /mcp, and go run . mcp over stdio), and judges any server
// that claims the API (go run . check). main.go holds four books, one a program, in the order
// main dispatches them, each entered by one door: every banner names its book, so
// grep '^// ===== mcp:' main.go is the door's table of contents. A book reaches another only
// through that door (the server's serveInside and openers, the door's doorway, the kit's
// runKit), and what two books use stands in the shared section before them.
//
// shared: what two books use (the body cap, request ids, flags, hosts and origins, the lines a
// command writes, masking and escaping).
//   - shared: what two books use, kept here so that neither reaches into the other
//
// serve (go run .): the process, then the path of a request through the server in the order
// a request meets it, then what needs no key, and the service inside this process that the
// other books come in by. What one operation needs lives with it (tracking.go, orders.go,
// auth.go).
//   - serve: flags and environment
//   - serve: loading, serving and the way out
//   - serve: the collector
//   - serve: the server and its route table
//   - serve: every request: a clean path, its route, its call, a panic made a 500
//   - serve: browsers: CORS
//   - serve: the checks, in their order: declared size, key, live environment, rate limit, scope
//   - serve: Prefer: a simulated answer, a delay, an instant of one's own
//   - serve: faults for clients that cannot send a header
//   - serve: the body: read once, up to its cap
//   - serve: writes: Idempotency-Key, and the answers stored under it
//   - serve: the handlers: the four operations, the test helpers and the MCP door
//   - serve: writing an answer: a problem, and the journal's entry
//   - serve: the access log
//   - serve: what needs no key: health, the document, and what no route serves
//   - serve: the service inside this process: the door other books come in by
//
// landing: the pages for people: the one a browser opens at /, a view of the server's
// tenants, and the reference (with its Markdown, llms.txt and the embedded pages).
//   - landing: the page a browser opens at /
//   - landing: the reference, for people and for agents
//
// mcp (POST /mcp, go run . mcp): the MCP door, in the order a POST meets it, then the
// transports over it.
//   - mcp: POST /mcp, who may knock, and the envelope
//   - mcp: the revision, and the method
//   - mcp: the tools, one table
//   - mcp: a tool's call, its API requests, and its result
//   - mcp: the resources
//   - mcp: stdio and the bridge, the transports over the door
//
// check (go run . check, go run . exam): the conformance kit, a client of the API, in the
// order a run meets it; then go run . exam, a client of the exam routes. It shares with the server only the contract's words (paths, codes, vocabularies,
// limits) and the shared section: it decodes answers into types of its own, and main hands
// it what starts this sandbox for its self-check.
//   - check: its command and its flags
//   - check: its requests, and what it keeps of their answers
//   - check: its pace
//   - check: results and their evidence, each request a curl command
//   - check: JSON, read with its own eyes
//   - check: its world
//   - check: the catalogue, and a run of it
//   - check: the catalogue's judges of auth.*
//   - check: the catalogue's judges of tracking.*
//   - check: the catalogue's judges of orders.*
//   - check: the catalogue's judges of http.*, errors.* and limits.*
//   - check: its reports
//   - check: check diff, two reports side by side
//   - check: go run . exam, a client of the exam routes for CI
//   - check: exam run, an exam taken several times with the client's own command
//   - check: exam lint, the checks that need no world, on any HAR
//   - check: exam regrade, an attempt's trace judged again with no server
package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"encoding/xml"
	"errors"
	"flag"
	"fmt"
	"html"
	"html/template"
	"io"
	"io/fs"
	"log"
	"log/slog"
	"maps"
	"math"
	"math/big"
	"math/bits"
	mrand "math/rand/v2"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"reflect"
	"regexp"
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
	"unicode"
	"unicode/utf8"
)

//go:embed dataset.json
var defaultDataset []byte

//go:embed openapi.json
var openAPIDocument []byte

// defaultBaseURL is the base URL of `go run .`, as the OpenAPI document states it.
const defaultBaseURL = "http://127.0.0.1:8080/v1"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	var status int
	switch commandOf(os.Args) {
	case "serve": // the sandbox: go run . and its flags
		status = serveMain(ctx)
	case "mcp": // the MCP door over stdio
		signal.Ignore(syscall.SIGPIPE) // a closed stdout is a write's error, and ends the session cleanly
		status = runMCP(ctx, os.Args[2:], os.Stdin, os.Stdout, os.Stderr, func(ctx context.Context, args []string, usage io.Writer) (bridgeTarget, error) {
			return openBridgeTarget(ctx, args, os.Getenv, usage, boundHeapGrowth)
		})
	case "exam": // a client of the exams, for CI
		log.SetOutput(io.Discard) // as for check: Go's transport logs a hostile server's unsolicited bytes
		status = runExam(ctx, os.Args[2:], examDeps{getenv: os.Getenv, stdout: os.Stdout, stderr: os.Stderr, sleep: sleepFor, now: time.Now, colour: colourTerminal(os.Stdout, os.Getenv), stdin: os.Stdin})
	case "check": // the conformance kit
		// Go's HTTP transport writes what a server sends unasked on an idle connection to the
		// standard logger ("Unsolicited response received on idle HTTP channel starting with
		// ..."): a hostile server's bytes, the keys it echoes among them. Nothing else of the
		// kit uses that logger, and what the kit writes it masks: it is silenced.
		log.SetOutput(io.Discard)
		status = runCheck(ctx, os.Args[2:], os.Getenv, os.Stdout, os.Stderr, startSelfCheck)
	}
	stop()
	os.Exit(status)
}

// commandOf is the command args name: mcp, check or exam as the first argument, else serve
// (go run . and its flags).
func commandOf(args []string) string {
	if len(args) > 1 && (args[1] == "mcp" || args[1] == "check" || args[1] == "exam") {
		return args[1]
	}
	return "serve"
}

// serveMain is go run .: the sandbox served until a signal, its exit status 1 when it could
// not start or stop cleanly (2 for flags unsafe together), the reason on stderr.
func serveMain(ctx context.Context) int {
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr, boundHeapGrowth)
	if err == nil {
		return 0
	}
	// run has left finalLineWait of its bound for this line.
	errs := newConsole(os.Stderr)
	errs.say("sandbox: " + err.Error() + "\n")
	errs.close(time.Now().Add(finalLineWait))
	if errors.As(err, new(*refusedSetting)) {
		return 2
	}
	return 1
}

// ===== shared: what two books use, kept here so that neither reaches into the other =====

// A helper two books use stands here, not in either book: a book reaches another only
// through that book's one door (the server's serveInside, the door's doorway, the kit's
// runKit). What is here: the body cap and request ids (the server, and the door's problems
// and bridge); flags (every command's); hosts, origins and base URLs (the server, the page,
// the door, the kit); the lines a command writes for a person, which never wait on a stalled
// terminal (main, the server, the stdio session); and what a command writes of what a server
// or a user sent: masked (no key), escaped (no control character) and cut.

// embeddedPages are the README and the docs pages, embedded so that the binary (and the
// image) holds them: the MCP door's resources, and the reference's pages.
//
//go:embed README.md docs/*.md
var embeddedPages embed.FS

// usageError is a flag refused: go run . mcp exits 2 for it.
type usageError struct{ error }

func (e *usageError) Unwrap() error { return e.error }

// maxBodyBytes is the request body limit: 256 KiB.
const maxBodyBytes = 256 << 10

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

// namesLoopback reports whether a valid host names this machine's loopback: localhost,
// 127.0.0.0/8 or [::1].
func namesLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(strings.Trim(host, "[]"))
	return err == nil && ip.IsLoopback()
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

// shellQuote is s in single quotes, as a POSIX shell reads it.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// originMark stands for the serving origin in an answer prepared once (the document, the
// reference): each answer puts the origin its request named in its place.
const originMark = "http://origin.invalid"

// originOfBase is a base URL's origin: its scheme and host.
func originOfBase(base string) string {
	u, err := url.Parse(base)
	if err != nil {
		return base
	}
	return u.Scheme + "://" + u.Host
}

// apiBaseURL is the base URL of a server under check, its one trailing / dropped: an
// absolute http or https URL with a host, and no user, query or fragment (the kit appends
// the spec's paths to it).
func apiBaseURL(v string) (string, error) {
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return "", errors.New("want an absolute http or https URL, the API's base, such as http://127.0.0.1:8080/v1")
	}
	return strings.TrimSuffix(v, "/"), nil
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

// finalLineWait is how long main's last line (run's error) may wait for stderr: run's
// own waits end twice that before the bound.
const finalLineWait = 500 * time.Millisecond

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

// minMaskedKey is the shortest key the kit carries: it masks every part of a key of this
// length or more in what it writes, and a shorter one could not be masked without
// garbling the report.
const minMaskedKey = 8

// secrets are keys that nothing a command writes may hold (the kit's, the bridge's): a key
// whole is written as the variable it is named by ($KEY, $SANDBOX_MCP_KEY), and any part of
// one of minMaskedKey characters or more (a key cut short, or run into other text) as [key].
// A key shorter than minMaskedKey is not masked: it could not be without garbling what is
// written (the kit refuses one). What a server sent or the user gave is masked, field by
// field; a command's own words are not, so that a key that shares a word with them
// (sk_test_sandbox_tracking and tracking.utc) garbles nothing of the kit's catalogue.
type secrets struct {
	mu    sync.Mutex
	whole []secret        // longest first
	parts map[string]bool // every minMaskedKey-byte part of every key
}

type secret struct {
	text, name string
}

// newSecrets are the keys of keys, each by the name it is written as.
func newSecrets[N ~string](keys map[N]string) *secrets {
	s := &secrets{parts: map[string]bool{}}
	for name, key := range keys {
		s.add(key, string(name))
	}
	return s
}

// add keeps key, named name, to be masked.
func (s *secrets) add(key, name string) {
	if len(key) < minMaskedKey {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.whole = append(s.whole, secret{key, name})
	slices.SortStableFunc(s.whole, func(a, b secret) int { return len(b.text) - len(a.text) })
	for i := 0; i+minMaskedKey <= len(key); i++ {
		s.parts[key[i:i+minMaskedKey]] = true
	}
}

// mask is text with every key whole written as its name's variable, and every run of text
// that parts of keys cover written as [key].
func (s *secrets) mask(text string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range s.whole {
		text = strings.ReplaceAll(text, k.text, "$"+k.name)
	}
	covered := make([]bool, len(text))
	found := false
	for i := 0; i+minMaskedKey <= len(text); i++ {
		if s.parts[text[i:i+minMaskedKey]] {
			for j := i; j < i+minMaskedKey; j++ {
				covered[j] = true
			}
			found = true
		}
	}
	if !found {
		return text
	}
	var b strings.Builder
	for i := 0; i < len(text); i++ {
		switch {
		case !covered[i]:
			b.WriteByte(text[i])
		case i == 0 || !covered[i-1]:
			b.WriteString("[key]")
		}
	}
	return b.String()
}

// printable is s as a line of text shows it safely: a control character (a newline, an
// escape), a line or paragraph separator and a bidirectional control written as \uXXXX,
// invalid UTF-8 as \ufffd, so that what a server sends can neither forge a line of the
// report nor move a terminal's cursor.
func printable(s string) string {
	var b strings.Builder
	for _, r := range strings.ToValidUTF8(s, "\ufffd") {
		switch {
		case r == '\ufffd' || r == '\ufffe' || r == '\uffff' || unicode.IsControl(r) || r == '\u2028' || r == '\u2029' || r >= '\u202a' && r <= '\u202e' || r >= '\u2066' && r <= '\u2069' || r == '\u200e' || r == '\u200f':
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// xmlText is s as XML 1.0 character data or an attribute's value, made inert as printable
// makes a line, its lines kept: every control character but newline and tab, the
// characters XML 1.0 forbids (U+FFFE, U+FFFF) and invalid UTF-8 written as \uXXXX, and the
// markup characters escaped.
func xmlText(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = printable(strings.ReplaceAll(l, "\t", " "))
	}
	var b strings.Builder
	xml.EscapeText(&b, []byte(strings.Join(lines, "\n")))
	return b.String()
}

// junitReport is a JUnit report of one test suite, as the exam's grade, exam and check write
// it: every text of it made inert by xmlText when written.
type junitReport struct {
	name, timestamp string
	seconds         float64
	properties      [][2]string // name, value
	cases           []junitTest
}

// junitTest is one test case: passed, or failed (a failure), in error (an error: not judged,
// such as a grade still pending) or skipped, with its message and body.
type junitTest struct {
	class, name   string
	seconds       float64
	result        string // "pass", "fail", "error" or "skip"
	message, body string
}

// xml is the suite as a JUnit XML document.
func (s junitReport) xml() []byte {
	count := map[string]int{}
	for _, c := range s.cases {
		count[c.result]++
	}
	var b strings.Builder
	fmt.Fprintf(&b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuite name=\"%s\" tests=\"%d\" failures=\"%d\" errors=\"%d\" skipped=\"%d\" time=\"%.3f\"",
		xmlText(s.name), len(s.cases), count["fail"], count["error"], count["skip"], s.seconds)
	if s.timestamp != "" {
		fmt.Fprintf(&b, " timestamp=\"%s\"", xmlText(s.timestamp))
	}
	b.WriteString(">\n")
	if len(s.properties) > 0 {
		b.WriteString("  <properties>\n")
		for _, p := range s.properties {
			fmt.Fprintf(&b, "    <property name=\"%s\" value=\"%s\"/>\n", xmlText(p[0]), xmlText(p[1]))
		}
		b.WriteString("  </properties>\n")
	}
	for _, c := range s.cases {
		fmt.Fprintf(&b, "  <testcase classname=\"%s\" name=\"%s\" time=\"%.3f\">", xmlText(c.class), xmlText(c.name), c.seconds)
		element := map[string]string{"fail": "failure", "error": "error", "skip": "skipped"}[c.result]
		switch {
		case element != "" && c.body != "":
			fmt.Fprintf(&b, "<%s message=\"%s\">%s</%s>", element, xmlText(c.message), xmlText(c.body), element)
		case element != "":
			fmt.Fprintf(&b, "<%s message=\"%s\"/>", element, xmlText(c.message))
		}
		b.WriteString("</testcase>\n")
	}
	b.WriteString("</testsuite>\n")
	return []byte(b.String())
}

// entriesCited names journal entries by their seqs, as a grade's reader meets them:
// "journal entry 2", "journal entries 2, 5 and 63"; "" for none.
func entriesCited(seqs []uint64) string {
	words := make([]string, len(seqs))
	for i, q := range seqs {
		words[i] = strconv.FormatUint(q, 10)
	}
	switch len(words) {
	case 0:
		return ""
	case 1:
		return "journal entry " + words[0]
	}
	return "journal entries " + strings.Join(words[:len(words)-1], ", ") + " and " + words[len(words)-1]
}

// cutField is at most n bytes of s (cut at a UTF-8 boundary), and ... when cut.
func cutField(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// ===== serve: flags and environment =====

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
	mcpKey       string     // -mcp-key: what an MCP request without Authorization acts as; "" for none
	mcpKeyName   string     // what the user set it with: -mcp-key, or SANDBOX_MCP_KEY

	// go run . mcp's: the sandbox whose door it carries messages to (-base-url; "": its
	// own), and what it is told once its own serves.
	bridgeTo string
	serving  func(srv *server, base string)

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
	return parseConfigFor(args, getenv, usage, false)
}

// parseConfigFor reads the flags of go run . or, for mcp, of go run . mcp: the same, but
// -addr 127.0.0.1:0 by default (a free port: a taken one is never the agent's problem), and
// -base-url, which starts no sandbox and takes no flag of one.
func parseConfigFor(args []string, getenv func(string) string, usage io.Writer, mcp bool) (config, error) {
	cfg := defaultConfig()
	name, who, intro, help := "sandbox", "the sandbox", "Usage: sandbox [flags]; each flag falls back to SANDBOX_<NAME> (e.g. SANDBOX_SEED_ORDERS).", "-h"
	if mcp {
		cfg.addr = "127.0.0.1:0"
		name, who, intro, help = "sandbox mcp", "mcp", "Usage: sandbox mcp [flags]: the MCP door over stdio (newline-delimited JSON-RPC on standard input and output), to a sandbox started here as sandbox [flags] starts one (but on a free loopback port), or with -base-url to one that runs; each flag falls back to SANDBOX_<NAME>.", "mcp -h"
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
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
	doorFlags(fs, &cfg, mcp)
	given, err := parseFlags(fs, args, usage, intro, who, help)
	if err != nil {
		return cfg, err
	}
	if given["base-url"] {
		for f := range given {
			if f != "base-url" && f != "mcp-key" {
				return cfg, fmt.Errorf("-%s: -base-url starts no sandbox, so it takes none of a sandbox's flags (only -mcp-key)", f)
			}
		}
	}
	cfg.addrName = namedBy(given, getenv, "addr")
	cfg.dataName = namedBy(given, getenv, "data")
	cfg.mcpKeyName = namedBy(given, getenv, "mcp-key")
	if err := fallBack(fs, given, getenv, "SANDBOX_"); err != nil {
		return cfg, err
	}
	if cfg.corsOrigin == "*" && cfg.mcpKey != "" && cfg.bridgeTo == "" {
		return cfg, &refusedSetting{namedBy(given, getenv, "cors-origin") + " '*' with " + cfg.mcpKeyName + ": any web page could then drive the MCP door as that key (a page's request carries no Authorization, and acts as -mcp-key); name your app's origin with -cors-origin, or drop -mcp-key"}
	}
	return cfg, nil
}

// namedBy is what the user set a flag's value with, for a message about it: the flag, or
// its variable when only that is set.
func namedBy(given map[string]bool, getenv func(string) string, flag string) string {
	variable := "SANDBOX_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
	if !given[flag] && getenv(variable) != "" {
		return variable
	}
	return "-" + flag
}

// doorFlags are the flags of the MCP door: -mcp-key, and go run . mcp's -base-url.
func doorFlags(fs *flag.FlagSet, cfg *config, mcp bool) {
	fs.Func("mcp-key", "the test `key` an MCP request without Authorization acts as: over HTTP, one from a loopback address (default: none); go run . mcp's every request (default sk_test_sandbox_all)", func(v string) error {
		if v == "" || strings.ContainsFunc(v, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
			return errors.New("want a test key of this sandbox, such as sk_test_sandbox_all")
		}
		cfg.mcpKey = v
		return nil
	})
	if mcp {
		fs.Func("base-url", "carry the messages to the sandbox that runs at this API base `URL` (its /mcp), such as http://127.0.0.1:8080/v1, rather than start one (default: start one)", func(v string) (err error) {
			cfg.bridgeTo, err = apiBaseURL(v)
			return err
		})
	}
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

// refusedSetting is a start refused for flags that are unsafe together: exit status 2.
type refusedSetting struct{ why string }

func (e *refusedSetting) Error() string { return e.why }

// ===== serve: loading, serving and the way out =====

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
	return runConfigured(ctx, cfg, getenv, stdout, stderr, tuneHeap)
}

// runConfigured is run once the configuration is read.
func runConfigured(ctx context.Context, cfg config, getenv func(string) string, stdout, stderr io.Writer, tuneHeap heapTuner) error {
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
	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return cfg.loadStopTimeout, listenError(cfg, err)
	}
	base := baseURL(ln.Addr())
	stopping := make(chan struct{})
	srv, err := newServer(sb, serverOptions{rate: cfg.rate, cursorSecret: cfg.cursorSecret, baseURL: base, log: logger, access: logs,
		stopping: stopping, corsOrigin: cfg.corsOrigin, loopback: isLoopback(ln.Addr()), faults: cfg.faults, journal: cfg.journal, mcpKey: cfg.mcpKey, getenv: getenv,
		writeTimeout: cfg.writeTimeout})
	if err != nil {
		ln.Close()
		return cfg.loadStopTimeout, err
	}
	// The heap tuned once everything built at start is built (the reference and the MCP door
	// among it): its collection then frees what building them left, which a headroom set
	// before would keep resident.
	if tuneHeap != nil {
		defer tuneHeap(getenv)()
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
	h := srv.handler()
	if cfg.serving != nil {
		cfg.serving(srv, base)
	}
	err = serve(ctx, newHTTPServer(cfg, h, logger), ln, func() {
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
	fmt.Fprintf(&b, "In a browser: %s/ shows %s and what moves on the sandbox clock; %s/reference every operation, schema and error (agents: %s/llms.txt).\n", origin, shows, origin, origin)
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

// ===== serve: the collector =====

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

// ===== serve: the server and its route table =====

// The server: the dataset's operations, one route table, and the handler that serves it;
// each route's checks are wrappers chained in the contract's order, each answering or
// handing the request on with what it found in the request's call.

// serverOptions are the server's settings besides its data.
type serverOptions struct {
	rate         int
	cursorSecret string
	baseURL      string
	log          *slog.Logger        // start-up notes, panics, net/http's own reports
	access       *logBuffer          // the access log: one line per request; nil for none
	stopping     <-chan struct{}     // closed when the server starts shutting down
	corsOrigin   string              // "": no CORS headers
	faults       *faultPlan          // nil: no faults
	loopback     bool                // listening on loopback only: the landing page shows the keys
	now          func() time.Time    // the wall clock: tenants' clocks follow it, and the rate limit uses it
	journal      int                 // the entries each tenant's journal keeps; 0: none
	journalBytes int64               // what all journals may hold together; 0: maxJournalBytes
	mcpKey       string              // -mcp-key: what an MCP request from a loopback address without Authorization acts as
	getenv       func(string) string // the process's environment, for check_server's keys; nil: none
	writeTimeout time.Duration       // the listener's: a tool call is answered before it; 0: defaultConfig's
}

// server is the service over one loaded dataset.
type server struct {
	// drained counts the requests that finished after shutdown began, for the stopped
	// line. Only those write it: a counter every request wrote would bounce its cache line
	// between the cores, which the served throughput against plain net/http shows.
	drained      atomic.Int64
	cors         *cors           // nil: no CORS headers
	faults       *faultPlan      // nil: -faults is off
	registry     *tenantRegistry // the bounds every tenant's bookkeeping shares, and the sandboxes
	landing      *landing
	reference    *referencePages
	clocks       clockHelpers
	keys         keyFinder
	templates    map[string]*sandboxTemplate // the dataset's accounts a sandbox may copy
	rate         *rateLimit                  // nil: no rate limit
	cursors      *cursorSigner
	pages        sync.Pool // of *[]byte: the buffers pages are assembled in
	now          func() time.Time
	log          *slog.Logger
	access       *logBuffer
	stopping     <-chan struct{}
	openAPI      *openAPIDoc
	origin       string // the banner's origin: the address a request names, when its Host does not
	health       []byte
	loopback     bool          // it listens on loopback only
	writeTimeout time.Duration // the listener's: the MCP door answers a call before it
	mcp          *mcpDoor      // the MCP door
	inner        http.Handler  // the whole service, as handler built it: what the door's tools send their requests through
}

// settle gives each option left unset its default: the wall clock, no log, the default base
// URL, the journals' bound, the listener's write timeout, an empty environment.
func (o *serverOptions) settle() {
	if o.now == nil {
		o.now = time.Now
	}
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	o.baseURL = cmp.Or(o.baseURL, defaultBaseURL)
	o.journalBytes = cmp.Or(o.journalBytes, maxJournalBytes)
	o.writeTimeout = cmp.Or(o.writeTimeout, defaultConfig().writeTimeout)
	if o.getenv == nil {
		o.getenv = func(string) string { return "" }
	}
}

// newServer builds the service of sb's tenants with the options o (each unset one its default).
func newServer(sb *sandbox, o serverOptions) (*server, error) {
	o.settle()
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
	srv := &server{
		cors:         c,
		faults:       o.faults,
		registry:     newTenantRegistry(sb.tenants.list, o.journal, o.journalBytes),
		landing:      newLanding(sb, o.loopback, o.faults),
		clocks:       clockHelpers{wall: o.now},
		templates:    sb.templates,
		rate:         newRateLimit(o.rate, o.now()),
		cursors:      newCursorSigner(secret),
		pages:        sync.Pool{New: func() any { return new([]byte) }},
		now:          o.now,
		log:          o.log,
		access:       o.access,
		stopping:     o.stopping,
		openAPI:      doc,
		origin:       strings.TrimSuffix(o.baseURL, "/v1"),
		health:       []byte(`{"status":"ok"}`),
		loopback:     o.loopback,
		writeTimeout: o.writeTimeout,
	}
	if srv.reference, err = theReference(); err != nil {
		return nil, fmt.Errorf("the reference: %w", err)
	}
	srv.keys = keyFinder{dataset: sb.keys, sandboxes: srv.registry, wall: o.now}
	marks := bytes.Count(doc.marked, []byte(originMark))
	srv.mcp, err = newMCPDoor(doorway{service: srv, knock: srv.knockMCP, document: srv.openAPI.forOrigin,
		documentSize: func(origin string) int { return len(doc.marked) + marks*(len(origin)-len(originMark)) },
		corsOrigin:   o.corsOrigin, loopback: o.loopback, origin: srv.origin, writeTimeout: o.writeTimeout, mcpKey: o.mcpKey, getenv: o.getenv})
	return srv, err
}

// route is one method and path the server answers, as a ServeMux pattern.
type route struct {
	pattern string
	handler callHandler
}

// routes lists every operation, test helper and page the server answers, each with its
// checks. A GET pattern serves HEAD too. handler adds, for each path, the 405 of its other
// methods, and the 404s of /v1 itself and of any path no route serves.
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
		{"POST /v1/test_helpers/sandboxes", s.idempotentWrite(codeAndDelay, s.postSandbox)},
		{"DELETE /v1/test_helpers/sandboxes/{account}", s.testHelper(codeAndDelay, s.deleteSandbox)},
		{"POST /v1/test_helpers/shipments", s.idempotentWrite(withClock, s.createShipment)},
		{"POST /v1/test_helpers/shipments/{id}/events", s.idempotentWrite(withClock, s.addShipmentEvents)},
		{"GET /v1/test_helpers/exams", s.examRoute(noParams(listExams))},
		{"POST /v1/test_helpers/exams", s.examWrite(true, s.startExam)},
		{"GET /v1/test_helpers/exams/{id}", s.examRoute(s.readGrade)},
		{"POST /v1/test_helpers/exams/{id}/answer", s.examWrite(false, s.answerExam)},
		{"GET /v1/test_helpers/exams/{id}/trace", s.examTrace(s.readTrace)},
		{"GET /v1/openapi.json", s.keyless(s.serveOpenAPI)},
		{"GET /v1/healthz", s.keyless(s.serveHealth)},
		{"POST /mcp", s.keyless(s.serveMCP)},       // the MCP door: its own checks
		{"GET /healthz", s.keyless(s.serveHealth)}, // also outside the base URL, for probes that know none
		{"GET /{$}", s.keyless(s.landingPage)},
		{"GET /reference", s.keyless(s.serveReference)}, // the reference, for people and for agents
		{"GET /reference.md", s.keyless(s.serveReferenceMarkdown)},
		{"GET /llms.txt", s.keyless(s.serveLLMs)},
		{"GET /README.md", s.keyless(s.servePage)},
		{"GET /docs/{page}", s.keyless(s.servePage)},
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
		h := methodNotAllowed(allow[path], s.cors == nil && underTheAPI(path))
		if underTheAPI(path) { // the pages are no API: no CORS there
			h = s.cors.preflight(allow[path], path == "/mcp", h)
		}
		mux.Handle(path, s.serveRoute(path, h))
	}
	for _, path := range []string{"/v1", "/v1/{$}"} {
		mux.Handle(path, s.serveRoute(path, s.v1Root))
	}
	mux.Handle("/", s.serveRoute("/", s.routeNotFound))
	s.inner = cleanPaths(s.serveRoute("", s.routeNotFound), mux)
	return s.inner
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
		if !s.registry.journaling() && c.key.tenant.rules.keepFirst == 0 { // a journal kept whole is kept whatever -journal
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
	checks := []wrapper{capDeclared, requireKey(&s.keys, s.now, keyRule{expiry: expiry, journaled: bool(j)}, s.registry.journaling()), refuseLive, limitRate(s.rate, s.now)}
	return chain(s.serveKeyed(h), append(append(checks, own...), s.readBody)...)
}

// examRoute wraps an exam route that reads: a test helper's checks (any active test key, its
// expiry judged by the wall clock; Prefer code and delay), but no rate limit and no journal,
// so that reading a grade never changes one; its own query.
func (s *server) examRoute(h keyedHandler) callHandler {
	return chain(s.serveKeyed(h), capDeclared, requireKey(&s.keys, s.now, keyRule{expiry: wallClock, standing: true}, false), refuseLive, s.simulate(codeAndDelay), s.readBody)
}

// examTrace wraps an attempt's trace: an exam route that reads no Prefer (a file kept as
// an artifact is the attempt's, never a rehearsal's).
func (s *server) examTrace(h keyedHandler) callHandler {
	return chain(s.serveKeyed(h), capDeclared, requireKey(&s.keys, s.now, keyRule{expiry: wallClock, standing: true}, false), refuseLive, s.readBody)
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
	unconfirmed    *apiError  // the write, done, is answered 502: Prefer asked for it, or an exam's script (the booking's first and third creations)
	unconfirmedBy  simulation // which of the two
	write          *writeMark // a write's key and body digest, once its body was read: the journal's too
	wildcard       string     // a write's {id}, when its route has one: the shipment whose events arrive
	bodySize       int64      // the bytes of its body, for the journal; -1 unknown
	body           []byte     // its body, once readBody read it
	shown          showing    // what its answer showed, for the journal
	made           string     // the id its write made (a shipment's, a sandbox's account), for an attempt's trace
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

// ===== serve: every request: a clean path, its route, its call, a panic made a 500 =====

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
	// An exam attempt's answer that is no read: its body is held until it is whole (its
	// Content-Length), so that its entry keeps its text for the trace, and is journaled
	// before the body is sent, as every entry is.
	holding bool
	held    []byte
}

func (sw *statusWriter) WriteHeader(status int) {
	if sw.c.status == 0 {
		sw.c.status = status
		if sw.holding = sw.c.journal != nil && sw.c.journal.tenant.exam != nil && sw.r.Method != http.MethodHead && !sw.c.readAnswer(sw.r.Method); !sw.holding {
			sw.s.writeEntry(sw)
		}
	}
	sw.ResponseWriter.WriteHeader(status)
}

func (sw *statusWriter) Write(b []byte) (int, error) {
	if sw.c.status == 0 {
		sw.WriteHeader(http.StatusOK)
	}
	if sw.holding {
		sw.held = append(sw.held, b...)
		if n, err := strconv.Atoi(sw.Header().Get("Content-Length")); err == nil && len(sw.held) < n {
			return len(b), nil
		}
		if err := sw.release(); err != nil {
			return 0, err
		}
		return len(b), nil
	}
	return sw.ResponseWriter.Write(b)
}

// release journals a held answer with its text, then sends it.
func (sw *statusWriter) release() error {
	if !sw.holding {
		return nil
	}
	sw.holding = false
	sw.s.writeEntry(sw)
	if len(sw.held) == 0 {
		return nil
	}
	_, err := sw.ResponseWriter.Write(sw.held)
	return err
}

// readAnswer reports whether the call's answer is a read of the four operations, whose text
// an attempt's trace renders again rather than keeps: a 200 GET that showed something.
func (c *call) readAnswer(method string) bool {
	return c.status == http.StatusOK && method == http.MethodGet && c.shown.kind >= showsOrder && c.shown.kind <= showsPage
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
	if cut && sw.holding {
		sw.holding = false
		s.writeEntry(sw)
	}
	sw.release() // an attempt's answer held whole: journaled, then sent
	end := time.Now()
	if route == "/" || route == "" { // no route serves it: its path is logged, so that a probe of /.well-known/... is not GET /
		route = s.loggedPath(sw.r.URL.EscapedPath())
	}
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

// ===== serve: browsers: CORS =====

// With -cors-origin, every answer under /v1 and /healthz carries the CORS headers that let a
// front end of that origin read it, and a preflight on a known path is answered before any
// key is looked at: the first check.

// cors is the -cors-origin setting.
type cors struct {
	origin string // the Access-Control-Allow-Origin value
}

// applies reports whether an answer at path carries the CORS headers: under /v1 and
// /healthz, not on the landing page nor on paths outside the API.
func (c *cors) applies(path string) bool { return underTheAPI(path) }

// underTheAPI reports whether path is the API's (under /v1, /healthz, the MCP door), not a
// page for people (/, the reference and the pages it serves).
func underTheAPI(path string) bool {
	return path == "/healthz" || path == "/mcp" || path == "/v1" || strings.HasPrefix(path, "/v1/")
}

// allow sets the headers every answer of a browser's origin carries.
func (c *cors) allow(h http.Header) {
	h.Set("Access-Control-Allow-Origin", c.origin)
	h.Set("Vary", "Origin")
	h.Set("Access-Control-Expose-Headers", "Request-Id, RateLimit, RateLimit-Policy, Retry-After, Preference-Applied, WWW-Authenticate, Location, Idempotent-Replayed")
}

// preflight answers a CORS preflight (OPTIONS with Origin and
// Access-Control-Request-Method) on a known path with 204 and the path's methods, the
// header fields asked for (the MCP door's own, on its path); any other request goes to
// next.
func (c *cors) preflight(methods []string, door bool, next callHandler) callHandler {
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
		if asked := r.Header.Values("Access-Control-Request-Headers"); door {
			h.Set("Access-Control-Allow-Headers", mcpAllowHeaders)
		} else if len(asked) > 0 {
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

// ===== serve: the checks, in their order: declared size, key, live environment, rate limit, scope =====

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

// keyRule is how a route's key is checked: the clock its expiry is judged by, whether its
// requests are journaled (in the key's tenant, while the journal is on, or always in an exam
// attempt's), and whether it is an exam route (whose requests leave an attempt's clock as it
// stands, and are never journaled).
type keyRule struct {
	expiry    expiryClock
	journaled bool
	standing  bool // its requests leave a clock that stands until a first request as it stands (the exam routes)
}

// requireKey answers 401 unless the request carries an active key, which it hands on with
// its tenant's clock, read once (an exam attempt's clock starts at its key's first request
// to a route other than the exam routes, which reads the start instant). A key's expiry is
// judged by that reading or by the wall clock, as the check says. A journaled request that
// names a key of a test environment, whatever its state, is journaled in its tenant.
func requireKey(keys *keyFinder, wall func() time.Time, kc keyRule, journalOn bool) wrapper {
	return func(next callHandler) callHandler {
		return func(w http.ResponseWriter, r *http.Request, c *call) {
			k, fault := keys.authenticate(r.Header)
			if k != nil {
				if !kc.standing && fault == nil { // a clock that stands until a first request starts
					k.tenant.clock.begin(wall)
				}
				c.data = k.tenant.current()
				c.clock = k.tenant.clock.read(wall)
				c.at = c.clock.now
				if kc.journaled && !k.tenant.live && (journalOn || k.tenant.rules.keepFirst > 0) {
					c.journal = k
				}
			}
			if fault == nil {
				judged := c.clock.now
				if kc.expiry == wallClock {
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
func limitRate(limit *rateLimit, now func() time.Time) wrapper {
	return func(next callHandler) callHandler {
		return func(w http.ResponseWriter, r *http.Request, c *call) {
			l := limit
			if c.key.limit != nil { // a key of a limit of its own: an exam attempt's, whatever -rate
				l = c.key.limit
			}
			if l == nil {
				next(w, r, c)
				return
			}
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

// ===== serve: Prefer: a simulated answer, a delay, an instant of one's own =====

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
				if fixed := c.key.tenant.rules.clockFixed; err == nil && p.clock != nil && fixed != nil {
					err = fixed // a clock not to be moved: no request is judged at an instant of its own
				}
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
				p = &preference{codeAt: -1, delayAt: -1}
			}
			answer, problem := s.simulatedFor(p, r, c, faultable)
			if write && answer != nil && answer.code == codeProviderNotConfirmed {
				c.simulated, c.unconfirmed, c.unconfirmedBy, answer = notSimulated, errUnconfirmedWrite, byPrefer, nil
			}
			if applied := p.appliedHeader(c.simulated == byPrefer); applied != "" {
				w.Header().Set("Preference-Applied", applied)
			}
			if p.clock != nil {
				c.at = *p.clock
			}
			if p.delay > 0 && !s.delay(r, c, p.delay) { // cut short by a shutdown: not applied
				p.delayCut = true
				w.Header().Del("Preference-Applied")
				if applied := p.appliedHeader(c.simulated == byPrefer); applied != "" {
					w.Header().Set("Preference-Applied", applied)
				}
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

// simulatedFor is the answer a request gets instead of its own, with its problem, or nil: the
// code Prefer asks for, unless its sequence has failed its times already; or, where
// faultable and no code is asked for, the request's fault under -faults.
func (s *server) simulatedFor(p *preference, r *http.Request, c *call, faultable bool) (*simulatedAnswer, *apiError) {
	t := c.key.tenant
	switch {
	case p.code != nil && p.times > 0 && t.countRequest(sequenceOf(r.Method, targetOf(r), r.Header["Prefer"]), s.now()) > p.times:
		return nil, nil // past its times: the answer it would get without code
	case p.code != nil:
		c.simulated = byPrefer
		return p.code, p.code.prefer
	case faultable && !t.rules.noFaults:
		k := t.faulted.Add(1)
		if answer := s.faults.failureOf(t.id, k); answer != nil {
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
// at once, so that draining is not held up. It reports whether it waited d whole.
func (s *server) delay(r *http.Request, c *call, d time.Duration) bool {
	readAhead(r, c)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.stopping:
		return false
	case <-r.Context().Done():
		abort(c)
		return false
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
	delayAt int        // and delay's
	// delayCut: the delay was cut short (a shutdown began), so Preference-Applied does not
	// name it.
	delayCut bool
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
	p := preference{codeAt: -1, delayAt: -1}
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
				p.delayAt, p.applied = len(p.applied), append(p.applied, "delay="+strconv.Itoa(ms))
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
// sequence has failed its times, or a fault of -faults, answers without it), and delay's
// unless it was cut short.
func (p *preference) appliedHeader(codeApplied bool) string {
	if (codeApplied || p.codeAt < 0) && !p.delayCut {
		return strings.Join(p.applied, ", ")
	}
	var named []string
	for i, a := range p.applied {
		if !(i == p.codeAt && !codeApplied || i == p.delayAt && p.delayCut) {
			named = append(named, a)
		}
	}
	return strings.Join(named, ", ")
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

// ===== serve: faults for clients that cannot send a header =====

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

// failureOf is the answer the k-th request of tenant t that -faults may fail fails with, or
// nil. h, the first 8 bytes of the SHA-256 of "S/account/environment/k" read as a
// big-endian unsigned integer over 2^64, fails it when it is under the rate R, with the
// answer at floor(h / R * len(answers)); in whole numbers, so that a client can predict it:
// h < R is x*10^6 < rate*2^64, and the index the high word of x*10^6*len over rate.
func (f *faultPlan) failureOf(t tenantID, k uint64) *simulatedAnswer {
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

// ===== serve: the body: read once, up to its cap =====

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

// ===== serve: writes: Idempotency-Key, and the answers stored under it =====

// The writes (test helpers that stand in for the real API's writes) pass the checks of a
// keyed route, then the spec's rules for writes: each carries one stored, unique
// idempotency value, Idempotency-Key (the IETF httpapi draft's header, and Stripe's). A
// repeat after the first finished is answered the first's answer again; a repeat while it
// runs, or the same key with another method, path or body, is 409. Only a write that was
// done is stored: after any other answer the key is free again.

// maxIdempotencyKey is the longest Idempotency-Key a write may carry.
const maxIdempotencyKey = 255

// idempotentWrite wraps a write in the checks of the contract, in its order: (route and method by the
// mux), declared body size (413), key (401, its expiry by the wall clock), live environment
// (503), rate limit (429), Idempotency-Key (400), Prefer (422), the body to its cap (413),
// the idempotency store (the first answer again, or 409), Prefer's delay (the key held
// meanwhile) and code 429, 500 or 503 (nothing written); then h, which judges the query, the
// body and the state and writes; a Prefer code=502 answers last, once the write is done.
func (s *server) idempotentWrite(reads preferences, h writeHandler) callHandler {
	return chain(s.serveWrite(h), capDeclared, requireKey(&s.keys, s.now, keyRule{expiry: wallClock, journaled: true}, s.registry.journaling()), refuseLive, limitRate(s.rate, s.now),
		requireIdempotencyKey, s.readPreferences(reads), s.readBody, s.idempotent, s.applyPreferences(false, true))
}

// examWrite wraps an exam route that writes: a write's checks in their order but the rate
// limit and the journal; the answer of an attempt (prefer false) reads no Prefer.
func (s *server) examWrite(prefer bool, h writeHandler) callHandler {
	checks := []wrapper{capDeclared, requireKey(&s.keys, s.now, keyRule{expiry: wallClock, standing: true}, false), refuseLive}
	if prefer { // a start counts against its key's rate limit, as any request of it does
		checks = append(checks, limitRate(s.rate, s.now), requireIdempotencyKey, s.readPreferences(codeAndDelay))
	} else { // an answer that arrived in time is graded, whatever a read does while its body arrives
		checks = append(checks, answerInFlight, requireIdempotencyKey)
	}
	checks = append(checks, s.readBody, s.idempotent)
	if prefer {
		checks = append(checks, s.applyPreferences(false, true))
	}
	return chain(s.serveWrite(h), checks...)
}

// answerInFlight marks an attempt's answer in flight from its key's check until it is
// answered, when it arrived before the attempt's last allowed instant: a read of the grade
// meanwhile does not compute it without the answer.
func answerInFlight(next callHandler) callHandler {
	return func(w http.ResponseWriter, r *http.Request, c *call) {
		if done := c.key.tenant.answerArrived(c.clock.now); done != nil {
			defer done()
		}
		next(w, r, c)
	}
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

// errScriptUnconfirmed answers the creations a tenant's write script does not confirm (the
// booking exam's two), one done and one not, alike: a client cannot tell them apart, as
// Prefer: code=502 answers one.
var errScriptUnconfirmed = &apiError{code: codeProviderNotConfirmed, detail: "The provider did not confirm the booking, which may or may not have been done (the exam's script): do not retry it blindly; send it again with the same Idempotency-Key, which answers the first write's result if it was done and books it if it was not."}

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
		c.write = &writeMark{key: c.idempotencyKey, body: sha256.Sum256(c.body)}
		request := sha256.Sum256(append([]byte(r.Method+"\x00"+r.URL.Path+"\x00"), c.write.body[:]...))
		t := c.key.tenant
		stored, found, err := s.registry.claim(t, c.idempotencyKey, request, s.now())
		switch {
		case err != nil:
			c.fail(w, err)
		case !found:
			defer func() { s.registry.settle(t, c.idempotencyKey, c.written, s.now()) }()
			if s.registry.hooks.claimed != nil {
				s.registry.hooks.claimed(t, c.idempotencyKey)
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
			stored.answer.replay(w)
		}
	}
}

// replay sends a stored answer: its status, Content-Type, Location and body.
func (a *storedAnswer) replay(w http.ResponseWriter) {
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
		c.wildcard = r.PathValue("id")
		err := refuseParams(r.URL.RawQuery)
		if err == nil {
			written, err = h(c)
		}
		if err != nil && c.key.tenant.gone.Load() {
			// Its sandbox was forgotten while it ran (its key checked before the DELETE):
			// whatever its checks found in the data it still held, nothing was written, and
			// its key is unknown from now on. Say so rather than answer a 409 or a 404 of data
			// that no longer exists. No preference shaped that answer: none is said applied.
			err = errForgotten
			w.Header().Del("Preference-Applied")
		}
		if err != nil {
			s.writeError(w, c, err)
			return
		}
		c.written = written
		switch {
		case c.unconfirmed != nil:
			if c.simulated = c.unconfirmedBy; c.simulated == byPrefer {
				w.Header().Set("Preference-Applied", c.prefer.appliedHeader(true))
			}
			c.fail(w, c.unconfirmed)
		default:
			written.replay(w)
		}
	}
}

// ===== serve: the handlers: the four operations, the test helpers and the MCP door =====

// The operations read their wildcards (named in the route table) and ask the tenant's
// indexes, which take values and answer bytes or an error; each notes in the call what its
// answer shows, for the journal. The test helpers read the tenant's clock, timeline and
// journal; the writes (a sandbox made, a shipment created, its events added, an exam's
// attempt started and answered) return the answer the write wrapper stores under the
// Idempotency-Key; the exam routes each make one call into the exam book (auth.go) and write
// what it returns; POST /mcp is handed to the door.

func trackingByID(w http.ResponseWriter, r *http.Request, c *call) error {
	v, s, err := c.data.shipments.viewByID(r.PathValue("id"), c.at)
	return writeView(w, c, v, s, err)
}

func trackingByNumber(w http.ResponseWriter, r *http.Request, c *call) error {
	v, s, shown, err := c.data.numberLookup(r.PathValue("tracking_number"), c.at)
	c.shown = shown
	return writeView(w, c, v, s, err)
}

// numberLookup is GET /v1/tracking/{tracking_number}'s work at at: the view of the shipment
// found, or the error, and what a 404 showed the findings (a number several shipments hold,
// or a further parcel's).
func (d *tenantData) numberLookup(number string, at time.Time) (viewParts, *shipment, showing, error) {
	v, s, err := d.shipments.viewByNumber(number, at)
	switch {
	case err == errTrackingAmbiguous && d.adapter: // the domain adapter's 409
		return v, nil, showing{}, ambiguousNumber(d.shipments.holdersAt(number, at))
	case err == errTrackingAmbiguous:
		return v, s, showing{kind: showsSharedNumber, ship: s}, err
	case err == errTrackingNotFound:
		if p, i := d.shipments.parcelHolder(number, at); p != nil { // a further parcel's number: the findings name it
			return v, s, showing{kind: showsParcelNumber, ship: p, order: int32(i)}, err
		}
	}
	return v, s, showing{}, err
}

// ambiguousNumber is the domain adapter's answer to a number n shipments hold: 409.
func ambiguousNumber(n int) *apiError {
	return &apiError{code: codeAmbiguousNumber, detail: fmt.Sprintf("This tracking number is held by %d shipments in this account and environment: read each by its shipment ID (GET /v1/shipments/{id}/tracking). The domain adapter answers 409 here; the sandbox's profile answers 404.", n)}
}

// writeView answers with a tracking view of s, or returns the error found instead.
func writeView(w http.ResponseWriter, c *call, v viewParts, s *shipment, err error) error {
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
	if _, err := parseClockBody(c.body, c.key.tenant.start); err == nil && c.key.tenant.rules.clockFixed != nil {
		return c.key.tenant.rules.clockFixed
	}
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

// postSandbox answers POST /v1/test_helpers/sandboxes: a sandbox of its own for the caller.
func (s *server) postSandbox(c *call) (*storedAnswer, error) {
	b, err := s.registry.newSandbox(c.body, c.key, s.templates, s.now())
	if err != nil {
		return nil, err
	}
	var made struct {
		Account string `json:"account"`
	}
	if json.Unmarshal(b, &made) == nil {
		c.made = made.Account
	}
	return &storedAnswer{status: http.StatusCreated, contentType: jsonContentType, body: b}, nil
}

// createShipment answers POST /v1/test_helpers/shipments: a shipment created in the
// caller's sandbox at the request's instant, linking the order it names.
func (s *server) createShipment(c *call) (*storedAnswer, error) {
	c.write.orderID = bookedOrder(c.body)
	script := c.key.tenant.rules.script
	return s.writeShipment(c, func(d *tenantData) (*tenantData, *shipment, error) {
		next, sh, err := d.withBooking(c.body, c.at, "")
		if err != nil || script == nil || len(next.links) == len(d.links) {
			return next, sh, err
		}
		switch script.booked() { // the script: a creation for an order that passed every check
		case bookingNotDone: // nothing written: the key is free again, and a retry with it books
			c.simulated = byScript
			return nil, nil, errScriptUnconfirmed
		case bookingDone: // done, answered 502 (unless Prefer asked for its 502)
			if c.unconfirmed == nil {
				c.unconfirmed, c.unconfirmedBy = errScriptUnconfirmed, byScript
			}
		}
		return next, sh, err
	})
}

// bookedOrder is the order_id a booking's body names at its top level, or "": the journal
// keeps it, for blind_retry judges a booking by its order.
func bookedOrder(body []byte) string {
	d := json.NewDecoder(bytes.NewReader(body))
	if t, err := d.Token(); err != nil || t != json.Delim('{') {
		return ""
	}
	for d.More() {
		name, err := d.Token()
		if err != nil {
			return ""
		}
		var v json.RawMessage
		if d.Decode(&v) != nil {
			return ""
		}
		var id string
		if name == "order_id" && json.Unmarshal(v, &id) == nil {
			return id
		}
	}
	return ""
}

// addShipmentEvents answers POST /v1/test_helpers/shipments/{id}/events: carrier events arrived
// for a shipment of the caller's sandbox at the request's instant.
func (s *server) addShipmentEvents(c *call) (*storedAnswer, error) {
	raw, err := readShipmentEvents(c.body, c.at)
	if err != nil {
		return nil, err
	}
	return s.writeShipment(c, func(d *tenantData) (*tenantData, *shipment, error) {
		return d.withShipmentEvents(c.wildcard, raw, c.at)
	})
}

// writeShipment writes the caller's tenant's next version of its data, which build makes
// with the shipment it creates or moves, and answers 201 with that shipment's tracking view
// as GET shows it at the request's instant.
func (s *server) writeShipment(c *call, build func(d *tenantData) (*tenantData, *shipment, error)) (*storedAnswer, error) {
	var written *shipment
	d, err := c.key.tenant.writeNext(s.registry, func(d *tenantData) (next *tenantData, err error) {
		next, written, err = build(d)
		return next, err
	})
	if err != nil {
		return nil, err
	}
	c.data, c.shown, c.made = d, showing{kind: showsWritten, ship: written}, written.id
	v := written.viewAt(c.at)
	return &storedAnswer{status: http.StatusCreated, contentType: jsonContentType, location: "/v1/shipments/" + url.PathEscape(written.id) + "/tracking",
		body: slices.Concat(v[:]...), shown: c.shown}, nil
}

// listExams answers GET /v1/test_helpers/exams: the catalogue.
func listExams(w http.ResponseWriter, r *http.Request, c *call) error {
	b, err := examListings()
	if err == nil {
		writeBody(w, http.StatusOK, jsonContentType, b)
	}
	return err
}

// startExam answers POST /v1/test_helpers/exams: an attempt of the exam the body names, its
// sandbox and its key made for the caller.
func (s *server) startExam(c *call) (*storedAnswer, error) {
	b, id, err := s.registry.newAttempt(c.body, c.key, s.now())
	if err != nil {
		return nil, err
	}
	return &storedAnswer{status: http.StatusCreated, contentType: jsonContentType, location: "/v1/test_helpers/exams/" + id, body: b}, nil
}

// readGrade answers GET /v1/test_helpers/exams/{id}: the attempt's grade as its clock now
// shows it (pending until its grading instant), as JSON or JUnit, read with its own key or
// the key that made it.
func (s *server) readGrade(w http.ResponseWriter, r *http.Request, c *call) error {
	junit, err := parseGradeQuery(r.URL.RawQuery)
	if err != nil {
		return err
	}
	b, contentType, err := s.registry.gradeRead(r.PathValue("id"), c.key, s.now, junit)
	if err == nil {
		writeBody(w, http.StatusOK, contentType, b)
	}
	return err
}

// readTrace answers GET /v1/test_helpers/exams/{id}/trace: the attempt's trace, as a file
// named for it, its URLs under the address the reader used.
func (s *server) readTrace(w http.ResponseWriter, r *http.Request, c *call) error {
	if p, _, ok := nextParam(r.URL.RawQuery); ok {
		return unknownParam(p.name, "GET /v1/test_helpers/exams/{id}/trace takes no query parameters.")
	}
	id := r.PathValue("id")
	b, err := s.registry.traceRead(id, c.key, s.now, originOf(r, s.origin), s.cursors)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Disposition", `attachment; filename="`+id+`.har"`)
	writeBody(w, http.StatusOK, jsonContentType, b)
	return nil
}

// parseGradeQuery reads the query of a grade's read: format, json (the default) or junit.
func parseGradeQuery(raw string) (junit bool, err error) {
	seen := false
	for p, rest, ok := nextParam(raw); ok; p, rest, ok = nextParam(rest) {
		switch {
		case p.name != "format":
			return false, unknownParam(p.name, "GET /v1/test_helpers/exams/{id} takes format.")
		case seen:
			return false, paramError(codeInvalidParameter, "format", "format is given more than once; give it once.")
		}
		seen = true
		v, err := p.value()
		if err != nil || v != "json" && v != "junit" {
			return false, paramError(codeInvalidParameter, "format", "format must be json (the default) or junit (one test case a check).")
		}
		junit = v == "junit"
	}
	return junit, nil
}

// answerExam answers POST /v1/test_helpers/exams/{id}/answer: the attempt graded with its
// answer, once its deadline has passed; with the attempt's key only.
func (s *server) answerExam(c *call) (*storedAnswer, error) {
	b, err := c.key.tenant.answerAttempt(c.wildcard, c.key, c.body, c.clock.now)
	if err != nil {
		return nil, err
	}
	return &storedAnswer{status: http.StatusOK, contentType: jsonContentType, body: b}, nil
}

var errNoSandbox = &apiError{code: codeNotFound, detail: "No sandbox of this account is named by the key: a key deletes the sandbox it was made for, and a dataset's account is never deleted."}

// deleteSandbox answers DELETE /v1/test_helpers/sandboxes/{account}: a key of that sandbox
// forgets it at once; any other account is 404.
func (s *server) deleteSandbox(w http.ResponseWriter, r *http.Request, c *call) error {
	t := c.key.tenant
	if t.sandbox == nil || t.id.account != r.PathValue("account") || !s.registry.forget(t.id.account) {
		return errNoSandbox
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// serveMCP hands POST /mcp to the MCP door, and notes in the call whom the request acted as
// (its log line names the account) and whether its answer was cut.
func (s *server) serveMCP(w http.ResponseWriter, r *http.Request, c *call) {
	var cut bool
	if c.key, cut = s.mcp.serveHTTP(w, r, c.body, c.arrived); cut {
		c.status = statusClientClosedRequest
	}
}

// knockMCP judges the key a request to the MCP door names, as the test helpers judge a key:
// a test key of this sandbox of any scopes, the scheme read as the API reads it (bearer and
// BEARER are Bearer), its expiry by the wall clock; a live key is 503. It returns the key and
// its text.
func (s *server) knockMCP(h http.Header) (*apiKey, string, *apiError) {
	k, err := s.keys.authenticate(h)
	switch {
	case err != nil:
		return nil, "", err
	case k.expiredAt(s.now()):
		return nil, "", errExpiredKey
	case k.tenant.live:
		return nil, "", errLive
	}
	token, _ := bearerToken(h)
	return k, token, nil
}

// ===== serve: writing an answer: a problem, and the journal's entry =====

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
	if c.code == codeRateLimited && c.simulated == notSimulated && c.key != nil && c.key.limit != nil {
		e.limited = s.now().Unix() // the wall clock's second, as the key's limiter read it
	}
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
	if c.journal.tenant.exam != nil {
		e.traced = tracedOf(sw, &e)
	}
	s.registry.keepEntry(c.journal.tenant, &e)
}

// tracedOf is what an attempt's entry e keeps for its trace: the body its write read, the
// text of its answer when it is no read (keys masked), the id its write made, and whether
// its target was cut. nil when it has none of them.
func tracedOf(sw *statusWriter, e *journalEntry) *tracedParts {
	c := &sw.c
	p := &tracedParts{made: c.made, targetCut: len(e.target) < len(targetOf(sw.r))}
	if c.body != nil || e.write != nil { // a body read, a write's empty one included
		p.body, p.contentType = c.body, sw.r.Header.Get("Content-Type")
		if p.body == nil {
			p.body = []byte{}
		}
	}
	if len(sw.held) > 0 {
		p.text = maskedKeys(sw.held)
	}
	if p.body == nil && p.text == nil && p.made == "" && !p.targetCut {
		return nil
	}
	return p
}

// maskedKeys is an answer's text with the value of every "key" member masked as the journal
// masks a key: a sandbox's 201 names its keys.
func maskedKeys(text []byte) []byte {
	const member = `"key":"`
	if !bytes.Contains(text, []byte(member)) {
		return text
	}
	var out []byte
	for rest := text; ; {
		i := bytes.Index(rest, []byte(member))
		if i < 0 {
			return append(out, rest...)
		}
		out = append(out, rest[:i+len(member)]...)
		rest = rest[i+len(member):]
		end := bytes.IndexByte(rest, '"')
		if end < 0 {
			return append(out, rest...)
		}
		out = append(out, keyMask(string(rest[:end]))...)
		rest = rest[end:]
	}
}

// ownMethod is a journaled request's method as a string of its own: net/http cuts it from
// the request line, which an entry would otherwise keep whole (up to the header limit)
// while the registry counts only what the entry shows. The methods journaled routes answer
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

// ===== serve: the access log =====

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

// loggedPath is a path no route serves as the log writes it: bounded, and never a key (a
// segment that is a key of this sandbox, or that names one as the sandbox's keys are named,
// sk_..., is written {key}).
func (s *server) loggedPath(path string) string {
	segments := strings.Split(path, "/")
	for i, seg := range segments {
		plain, err := url.PathUnescape(seg)
		if err != nil {
			plain = seg
		}
		if strings.Contains(strings.ToLower(plain), "sk_") || s.keys.known(plain) {
			segments[i] = "{key}"
		}
	}
	return boundLogValue(strings.Join(segments, "/"))
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

// ===== serve: what needs no key: health, the document, and what no route serves =====

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

func newOpenAPIDoc() (*openAPIDoc, error) { return theOpenAPIDoc() }

// theOpenAPIDoc is the document, its servers marked, made once for the process (a test makes
// hundreds of servers); no server changes it.
var theOpenAPIDoc = sync.OnceValues(func() (*openAPIDoc, error) {
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
})

// serveOpenAPI answers GET /v1/openapi.json: the document, its servers at the address the
// request used.
func (s *server) serveOpenAPI(w http.ResponseWriter, r *http.Request, c *call) {
	writeBody(w, http.StatusOK, jsonContentType, s.openAPI.forOrigin(originOf(r, s.origin)))
}

// forOrigin is the document as a request that named origin is served it.
func (doc *openAPIDoc) forOrigin(origin string) []byte {
	return bytes.ReplaceAll(doc.marked, []byte(originMark), []byte(origin))
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

// ===== serve: the service inside this process: the door other books come in by =====

// The other books reach the server through here only: the MCP door's tools send their API
// requests through serveInside (the whole handler chain, as a transport), go run . mcp's
// stdio session opens this sandbox with openBridgeTarget, and the kit's self-check starts
// one with startSelfCheck (main hands the kit the function: the kit knows none of this).

// insideAnswer is an answer of the API to a request made in this process.
type insideAnswer struct {
	status int
	header http.Header
	body   []byte
}

// insideWriter is what a request made in this process is answered to.
type insideWriter struct {
	insideAnswer
}

func (w *insideWriter) Header() http.Header { return w.header }

func (w *insideWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
}

func (w *insideWriter) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	if w.body == nil { // the whole answer, as its Content-Length says
		n, _ := strconv.Atoi(w.header.Get("Content-Length"))
		w.body = make([]byte, 0, max(n, len(b)))
	}
	w.body = append(w.body, b...)
	return len(b), nil
}

// serveInside answers req through the whole service, as if it had come over the network:
// its checks, its rate limit, its journal and its log line. false: the request was cut off
// (its client went away), and nothing was answered.
func (s *server) serveInside(req *http.Request) (a insideAnswer, ok bool) {
	w := &insideWriter{insideAnswer{header: http.Header{}}}
	defer func() {
		if v := recover(); v != nil && v != http.ErrAbortHandler {
			panic(v)
		}
		a, ok = w.insideAnswer, w.status != 0 && w.status != statusClientClosedRequest
	}()
	s.inner.ServeHTTP(w, req)
	return
}

// RoundTrip makes a server a transport of its own: the kit, checking this sandbox, sends
// its requests through it, in this process.
func (s *server) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.RequestURI == "" {
		req = req.Clone(req.Context())
		req.RequestURI, req.RemoteAddr = req.URL.RequestURI(), "127.0.0.1:0"
	}
	a, ok := s.serveInside(req)
	if !ok {
		return nil, errors.New("the request was cut off")
	}
	return &http.Response{Status: strconv.Itoa(a.status) + " " + http.StatusText(a.status), StatusCode: a.status, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: a.header, Body: io.NopCloser(bytes.NewReader(a.body)), ContentLength: int64(len(a.body)), Request: req}, nil
}

// openBridgeTarget is go run . mcp's opener (the MCP book's runMCP asks it): its flags, then
// this sandbox started on a free loopback port by default, as go run . would start it with
// its start lines and logs on stderr; or, with -base-url, the sandbox that runs there.
func openBridgeTarget(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer, tuneHeap heapTuner) (bridgeTarget, error) {
	cfg, err := parseConfigFor(args, getenv, stderr, true)
	if errors.Is(err, flag.ErrHelp) {
		return bridgeTarget{}, err
	}
	if err != nil {
		return bridgeTarget{}, &usageError{err}
	}
	session := bridgeTarget{base: cfg.bridgeTo, rt: &http.Transport{Proxy: nil, ResponseHeaderTimeout: bridgeExchange}, key: cmp.Or(cfg.mcpKey, defaultMCPKey),
		keyName: cmp.Or(cfg.mcpKeyName, "-mcp-key"), drain: cfg.drainTimeout, stop: func() error { return nil }}
	if session.base != "" {
		return session, nil
	}
	runCtx, stopRun := context.WithCancel(ctx)
	served := make(chan servedSandbox, 1)
	cfg.serving = func(srv *server, base string) { served <- servedSandbox{base, srv} }
	done := make(chan error, 1)
	go func() { done <- runConfigured(runCtx, cfg, getenv, stderr, stderr, tuneHeap) }()
	select {
	case sb := <-served:
		session.base, session.rt, session.inside = sb.base, sb.srv, true
		session.stop = func() error { stopRun(); return <-done }
		return session, nil
	case err := <-done:
		stopRun()
		return bridgeTarget{}, cmp.Or(err, errors.New("the sandbox stopped before it served"))
	}
}

// servedSandbox is a sandbox go run . mcp started: its base URL, and its server, which
// answers the bridge's messages in this process.
type servedSandbox struct {
	base string
	srv  *server
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

// ===== landing: the page a browser opens at / =====

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
	d := landingData{Origin: origin, BaseURL: origin + "/v1", Started: formatTimestamp(l.started), Faults: l.faults, Sandboxes: s.registry.count(s.now()),
		ShowKeys: l.loopback && valid && namesLoopback(host), MoreTenants: l.moreTenants}
	if d.ShowKeys && s.registry.journaling() {
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
			if s.registry.journaling() && !tk.t.live {
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

// ===== landing: the reference, for people and for agents =====

// The sandbox serves its own reference, made once at start from the tables the code keeps
// (the document's operations and schemas, the error codes with the document's words for
// them, the findings, the kit's catalogue, the exams' catalogue), so that nothing on it can
// drift from what the sandbox does: GET /reference, one page whole with JavaScript off (a
// small inline script adds search and a try-it form, and nothing else); GET /reference.md,
// the same in Markdown, its anchors as headings; GET /llms.txt, an index for agents; and
// GET /README.md and /docs/{page}.md, the pages the binary embeds. No request leaves the
// machine: no CDN, font or script from elsewhere. Each is prepared once with originMark
// where the serving origin stands, and each answer puts its own in.

//go:embed reference.html
var referenceHTML string

// referencePages are the reference's answers, prepared once.
type referencePages struct {
	html, markdown, llms []byte
}

// The reference's content, as the page and the Markdown read it.
type (
	referenceData struct {
		Origin     string
		Groups     []refGroup
		Schemas    []refSchema
		Responses  []refResponseDef
		Params     []refParamDef // the shared parameters whose description is said once
		Errors     []refError
		Findings   []refFinding
		Rules      []refRule
		Exams      []refExam
		Operations int
	}
	refGroup struct {
		Tag, Description string
		Ops              []refOp
	}
	refOp struct {
		ID, Method, Path, Summary, Description, Scopes string
		Keyless, NeedsSandboxKey                       bool
		Params                                         []refParam
		Body                                           *refBody
		Responses                                      []refResponse
		Samples                                        []refSample
		Try                                            refTry
	}
	refParam struct {
		Name, In, Type, Description, Example string
		Required                             bool
		Shared                               string // a long description said once: the shared parameter's name, at #param-Shared; "" for none
	}
	refBody struct {
		Schema   refType
		Examples []refExample
	}
	refType struct {
		Name string // a schema's name, linked; "" for an inline type
		Text string // the type as written
	}
	refExample  struct{ Name, Summary, JSON string }
	refResponse struct {
		Status, Description, Ref string // Ref: a shared response's name, its schema and examples at #response-Ref
		Types                    []refMedia
	}
	refMedia struct {
		ContentType string
		Schema      refType
		Examples    []refExample
	}
	refResponseDef struct {
		Name, Description string
		Types             []refMedia
	}
	refParamDef struct{ Name, Param, In, Description string }
	refSample   struct{ Lang, Code string }
	refTry      struct {
		Path, Query, Headers []refParam // the fields of its form, each prefilled with its example
		Body                 string
	}
	refSchema struct {
		Name, Description, Type string
		Props                   []refProp
		Enum                    string
	}
	refProp struct {
		Name, Description string
		Type              refType
		Required          bool
	}
	refError struct {
		Code, Description string
		Status            int
	}
	refFinding struct{ Code, Definition, Advice string }
	refRule    struct{ ID, Level, Title, Spec string }
	refExam    struct {
		Name, Title, Task, Given string
		Revision, Duration       int
		Answer                   bool
		Checks                   []examCheckRow
	}
	examCheckRow struct{ ID, Title string }
)

// jsonMembers are a JSON object's members in the order written, and their values.
func jsonMembers(raw json.RawMessage) ([]string, map[string]json.RawMessage) {
	values := map[string]json.RawMessage{}
	if json.Unmarshal(raw, &values) != nil {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.Token()
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			break
		}
		keys = append(keys, tok.(string))
		var skip json.RawMessage
		dec.Decode(&skip)
	}
	return keys, values
}

// refDoc is the document as the reference reads it: its top-level members, and its
// components by kind and name, each parsed once.
type refDoc struct {
	top        map[string]json.RawMessage
	components map[string]map[string]json.RawMessage
	order      map[string][]string // each kind's names, in the document's order
}

func newRefDoc(document []byte) refDoc {
	_, top := jsonMembers(document)
	d := refDoc{top: top, components: map[string]map[string]json.RawMessage{}, order: map[string][]string{}}
	kinds, comps := jsonMembers(top["components"])
	for _, k := range kinds {
		d.order[k], d.components[k] = jsonMembers(comps[k])
	}
	return d
}

// resolve follows a $ref, and returns the node and the name it was reached by ("" inline).
func (d refDoc) resolve(node json.RawMessage) (json.RawMessage, string) {
	var r struct {
		Ref string `json:"$ref"`
	}
	if json.Unmarshal(node, &r) == nil && strings.HasPrefix(r.Ref, "#/components/") {
		parts := strings.Split(strings.TrimPrefix(r.Ref, "#/components/"), "/")
		if len(parts) == 2 {
			return d.components[parts[0]][parts[1]], parts[1]
		}
	}
	return node, ""
}

// textOf is a string member of a node.
func textOf(node json.RawMessage, name string) string {
	_, m := jsonMembers(node)
	var s string
	json.Unmarshal(m[name], &s)
	return s
}

// compactJSON is a JSON value on one line, its members in their order.
func compactJSON(raw json.RawMessage) string {
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return string(raw)
	}
	return b.String()
}

// typeOf writes a schema's type: a schema of the document by its name, else its type (or
// its alternatives, oneOf, anyOf, allOf) with its items and its enum.
func (d refDoc) typeOf(schema json.RawMessage) refType {
	if node, name := d.resolve(schema); name != "" {
		return refType{Name: name, Text: name}
	} else {
		schema = node
	}
	_, m := jsonMembers(schema)
	var t any
	json.Unmarshal(m["type"], &t)
	var types []string
	switch v := t.(type) {
	case string:
		types = []string{v}
	case []any:
		for _, x := range v {
			types = append(types, fmt.Sprint(x))
		}
	}
	if items, ok := m["items"]; ok {
		inner := d.typeOf(items)
		for i, x := range types {
			if x == "array" {
				types[i] = "array of " + inner.Text
			}
		}
		if inner.Name != "" && len(types) == 1 {
			return refType{Name: inner.Name, Text: types[0]}
		}
	}
	if len(types) == 0 {
		for _, k := range []string{"oneOf", "anyOf", "allOf"} {
			var alts []json.RawMessage
			if json.Unmarshal(m[k], &alts) == nil && len(alts) > 0 {
				var names []string
				for _, a := range alts {
					names = append(names, d.typeOf(a).Text)
				}
				return refType{Text: strings.Join(names, " or ")}
			}
		}
		types = []string{"any"}
	}
	s := strings.Join(types, " or ")
	if enum, ok := m["enum"]; ok {
		s += ", one of " + strings.Trim(compactJSON(enum), "[]")
	}
	return refType{Text: s}
}

// examplesOf are a media object's examples: its named ones, in order, or its one example.
func examplesOf(media json.RawMessage) []refExample {
	keys, m := jsonMembers(media)
	var out []refExample
	if ex, ok := m["example"]; ok {
		out = append(out, refExample{Name: "example", JSON: compactJSON(ex)})
	}
	if slices.Contains(keys, "examples") {
		names, exs := jsonMembers(m["examples"])
		for _, n := range names {
			_, e := jsonMembers(exs[n])
			out = append(out, refExample{Name: n, Summary: textOf(exs[n], "summary"), JSON: compactJSON(e["value"])})
		}
	}
	return out
}

// mediaOf are a response's or a body's media types, each with its schema and examples.
func (d refDoc) mediaOf(node json.RawMessage) []refMedia {
	types, content := jsonMembers(memberOf(node, "content"))
	var out []refMedia
	for _, ct := range types {
		_, m := jsonMembers(content[ct])
		out = append(out, refMedia{ContentType: ct, Schema: d.typeOf(m["schema"]), Examples: examplesOf(content[ct])})
	}
	return out
}

// memberOf is a member of node.
func memberOf(node json.RawMessage, name string) json.RawMessage {
	_, m := jsonMembers(node)
	return m[name]
}

// sharedParamText is the longest description of a shared parameter an operation repeats:
// past it, an operation says its first sentence and links the parameter's one section.
const sharedParamText = 500

// firstSentence is text up to its first full stop followed by a space, or all of it.
func firstSentence(text string) string {
	if i := strings.Index(text, ". "); i >= 0 {
		return text[:i+1]
	}
	return text
}

// theReference is the reference of the embedded document, prepared once for the process.
var theReference = sync.OnceValues(func() (*referencePages, error) { return newReference(openAPIDocument) })

// newReference prepares the reference from the document and the code's tables, with
// originMark where the serving origin stands.
func newReference(document []byte) (*referencePages, error) {
	d := newRefDoc(document)
	data := referenceData{Origin: originMark}
	tags, err := d.operations(&data)
	if err != nil {
		return nil, err
	}
	data.Groups = tags
	data.Schemas = d.schemas()
	for _, n := range d.order["responses"] {
		r := d.components["responses"][n]
		data.Responses = append(data.Responses, refResponseDef{Name: n, Description: textOf(r, "description"), Types: d.mediaOf(r)})
	}
	for _, n := range d.order["parameters"] {
		if p := d.components["parameters"][n]; len(textOf(p, "description")) > sharedParamText {
			data.Params = append(data.Params, refParamDef{Name: n, Param: textOf(p, "name"), In: textOf(p, "in"), Description: textOf(p, "description")})
		}
	}
	data.Errors, data.Findings, data.Rules, data.Exams = d.errorRows(), findingRows(), kitRuleRows(), examRows()
	page, err := template.New("reference").Parse(referenceHTML)
	if err != nil {
		return nil, err
	}
	var html bytes.Buffer
	if err := page.Execute(&html, data); err != nil {
		return nil, err
	}
	return &referencePages{html: html.Bytes(), markdown: referenceMarkdown(data), llms: llmsText(data)}, nil
}

// operations reads every operation of the document, grouped by its first tag in the order
// the document lists its tags, each with its parameters, body, answers and samples.
func (d refDoc) operations(data *referenceData) ([]refGroup, error) {
	var tagList []struct{ Name, Description string }
	json.Unmarshal(d.top["tags"], &tagList)
	groups := make([]refGroup, len(tagList))
	index := map[string]int{}
	for i, t := range tagList {
		groups[i] = refGroup{Tag: t.Name, Description: t.Description}
		index[t.Name] = i
	}
	base := ""
	var servers []struct{ URL string }
	if json.Unmarshal(d.top["servers"], &servers) == nil && len(servers) > 0 {
		if u, err := url.Parse(servers[0].URL); err == nil {
			base = strings.TrimSuffix(u.Path, "/")
		}
	}
	paths, items := jsonMembers(d.top["paths"])
	for _, p := range paths {
		methods, ops := jsonMembers(items[p])
		for _, method := range methods {
			op := d.operation(strings.ToUpper(method), base+p, ops[method])
			var opTags []string
			json.Unmarshal(memberOf(ops[method], "tags"), &opTags)
			if len(opTags) == 0 {
				return nil, fmt.Errorf("the operation %s has no tag", op.ID)
			}
			i, ok := index[opTags[0]]
			if !ok {
				return nil, fmt.Errorf("the operation %s's tag %s is not the document's", op.ID, opTags[0])
			}
			groups[i].Ops = append(groups[i].Ops, op)
			data.Operations++
		}
	}
	return groups, nil
}

// operation reads one operation.
func (d refDoc) operation(method, path string, node json.RawMessage) refOp {
	_, m := jsonMembers(node)
	op := refOp{ID: textOf(node, "operationId"), Method: method, Path: path, Summary: textOf(node, "summary"), Description: textOf(node, "description")}
	var security []map[string][]string
	json.Unmarshal(m["security"], &security)
	op.Keyless = m["security"] != nil && len(security) == 0
	var scopes []string
	json.Unmarshal(m["x-required-scopes"], &scopes)
	op.Scopes = strings.Join(scopes, ", ")
	json.Unmarshal(m["x-needs-sandbox-key"], &op.NeedsSandboxKey)
	var params []json.RawMessage
	json.Unmarshal(m["parameters"], &params)
	for _, raw := range params {
		p, ref := d.resolve(raw)
		_, pm := jsonMembers(p)
		var required bool
		json.Unmarshal(pm["required"], &required)
		example := ""
		if ex, ok := pm["example"]; ok {
			var s string
			if json.Unmarshal(ex, &s) != nil {
				s = compactJSON(ex)
			}
			example = s
		}
		param := refParam{Name: textOf(p, "name"), In: textOf(p, "in"), Type: d.typeOf(pm["schema"]).Text, Description: textOf(p, "description"), Example: example, Required: required}
		if ref != "" && len(param.Description) > sharedParamText {
			param.Shared, param.Description = ref, firstSentence(param.Description)
		}
		op.Params = append(op.Params, param)
	}
	if body, ok := m["requestBody"]; ok {
		media := d.mediaOf(body)
		if len(media) > 0 {
			op.Body = &refBody{Schema: media[0].Schema, Examples: media[0].Examples}
		}
	}
	statuses, responses := jsonMembers(m["responses"])
	for _, status := range statuses {
		node, ref := d.resolve(responses[status])
		r := refResponse{Status: status, Description: textOf(node, "description"), Ref: ref}
		if ref == "" {
			r.Types = d.mediaOf(node)
		}
		op.Responses = append(op.Responses, r)
	}
	op.Samples, op.Try = samples(op)
	return op
}

// schemas reads every schema of the document, each with its properties.
func (d refDoc) schemas() []refSchema {
	var out []refSchema
	for _, n := range d.order["schemas"] {
		s := d.components["schemas"][n]
		_, m := jsonMembers(s)
		rs := refSchema{Name: n, Description: textOf(s, "description"), Type: d.typeOf(s).Text}
		var required []string
		json.Unmarshal(m["required"], &required)
		props, pm := jsonMembers(m["properties"])
		for _, p := range props {
			rs.Props = append(rs.Props, refProp{Name: p, Description: textOf(pm[p], "description"), Type: d.typeOf(pm[p]), Required: slices.Contains(required, p)})
		}
		out = append(out, rs)
	}
	return out
}

// errorRows are the error codes, in the document's order, each with its status from the
// one table of them and the document's words for it.
func (d refDoc) errorRows() []refError {
	node := memberOf(memberOf(d.components["schemas"]["Problem"], "properties"), "code")
	var enum []string
	json.Unmarshal(memberOf(node, "enum"), &enum)
	var words map[string]string
	json.Unmarshal(memberOf(node, "x-enumDescriptions"), &words)
	var out []refError
	for _, c := range enum {
		status := codeStatus[code(c)]
		out = append(out, refError{Code: c, Status: status, Description: strings.TrimPrefix(words[c], strconv.Itoa(status)+": ")})
	}
	return out
}

// findingRows are the findings, from their one table.
func findingRows() []refFinding {
	var out []refFinding
	for _, k := range findingKinds {
		out = append(out, refFinding{Code: k.code, Definition: k.definition, Advice: k.advice})
	}
	return out
}

// kitRuleRows are the conformance kit's rules, read from its catalogue (the page reads the
// table; it never runs a rule).
func kitRuleRows() []refRule {
	var out []refRule
	for _, r := range kitRules {
		out = append(out, refRule{ID: r.id, Level: string(r.level), Title: r.title, Spec: r.spec})
	}
	return out
}

// examRows are the exams, from their catalogue.
func examRows() []refExam {
	var out []refExam
	for _, e := range examCatalogue {
		x := refExam{Name: e.name, Title: e.title, Task: e.task, Given: string(e.world.givenJSON()), Revision: e.revision, Duration: int(examDuration / time.Second), Answer: e.answer != ""}
		for _, c := range e.checks {
			x.Checks = append(x.Checks, examCheckRow{c.id, c.title})
		}
		out = append(out, x)
	}
	return out
}

// sampleRequest is an operation's example request: its target at originMark, its headers
// (the key written as $SANDBOX_KEY) and its body (a write's first example). Its try-it form
// is made beside it (exampleRequest).
type sampleRequest struct {
	method, target, body string
	headers              [][2]string
}

// samples are an operation's request in curl, Go (net/http), JavaScript (fetch) and Python
// (urllib.request), the key written as $SANDBOX_KEY, its parameters their examples (the
// path's, and the required query's), a write's body its first example; and its try-it form.
func samples(op refOp) ([]refSample, refTry) {
	req, try := exampleRequest(op)
	return []refSample{{"curl", req.curl()}, {"Go", req.goCode()}, {"JavaScript", req.js()}, {"Python", req.python()}}, try
}

// exampleRequest is the operation's example request, and its try-it form.
func exampleRequest(op refOp) (sampleRequest, refTry) {
	path, query := op.Path, url.Values{}
	req := sampleRequest{method: op.Method}
	var try refTry
	if !op.Keyless {
		req.headers = append(req.headers, [2]string{"Authorization", "Bearer $SANDBOX_KEY"})
	}
	for _, p := range op.Params {
		switch p.In {
		case "path":
			path = strings.ReplaceAll(path, "{"+p.Name+"}", url.PathEscape(p.Example))
			try.Path = append(try.Path, p)
		case "query":
			if p.Required {
				query.Set(p.Name, p.Example)
			}
			try.Query = append(try.Query, p)
		case "header":
			if p.Required {
				req.headers = append(req.headers, [2]string{p.Name, p.Example})
			}
			try.Headers = append(try.Headers, p)
		}
	}
	req.target = originMark + path
	if len(query) > 0 {
		req.target += "?" + query.Encode()
	}
	if op.Body != nil && len(op.Body.Examples) > 0 {
		req.body = op.Body.Examples[0].JSON
		req.headers = append(req.headers, [2]string{"Content-Type", "application/json"})
		try.Body = req.body
	}
	return req, try
}

// headerHoldsKey reports whether a header's value is the key's.
func headerHoldsKey(h [2]string) bool { return strings.Contains(h[1], "$SANDBOX_KEY") }

func (req sampleRequest) curl() string {
	var b strings.Builder
	b.WriteString("curl -s")
	switch req.method {
	case http.MethodHead:
		b.WriteString(" -I")
	case http.MethodGet:
	default:
		b.WriteString(" -X " + req.method)
	}
	b.WriteString(" " + shellQuote(req.target))
	for _, h := range req.headers {
		v := shellQuote(h[0] + ": " + h[1])
		if headerHoldsKey(h) {
			v = `"` + h[0] + ": " + h[1] + `"`
		}
		b.WriteString(" \\\n  -H " + v)
	}
	if req.body != "" {
		b.WriteString(" \\\n  -d " + shellQuote(req.body))
	}
	return b.String()
}

// goCode is the request as a whole Go program, as the other languages' samples are whole:
// package main, its imports, and main.
func (req sampleRequest) goCode() string {
	var b strings.Builder
	imports := []string{"fmt", "io", "net/http"}
	reader := "nil"
	if req.body != "" {
		reader, imports = "strings.NewReader("+goString(req.body)+")", append(imports, "strings")
	}
	if slices.ContainsFunc(req.headers, headerHoldsKey) {
		imports = append(imports, "os")
	}
	slices.Sort(imports)
	b.WriteString("package main\n\nimport (\n")
	for _, p := range imports {
		fmt.Fprintf(&b, "\t%q\n", p)
	}
	fmt.Fprintf(&b, ")\n\nfunc main() {\n\treq, err := http.NewRequest(%q, %q, %s)\n\tif err != nil {\n\t\tpanic(err)\n\t}\n", req.method, req.target, reader)
	for _, h := range req.headers {
		if headerHoldsKey(h) {
			fmt.Fprintf(&b, "\treq.Header.Set(%q, \"Bearer \"+os.Getenv(\"SANDBOX_KEY\"))\n", h[0])
		} else {
			fmt.Fprintf(&b, "\treq.Header.Set(%q, %q)\n", h[0], h[1])
		}
	}
	b.WriteString("\tres, err := http.DefaultClient.Do(req)\n\tif err != nil {\n\t\tpanic(err)\n\t}\n\tdefer res.Body.Close()\n\tanswer, err := io.ReadAll(res.Body)\n\tif err != nil {\n\t\tpanic(err)\n\t}\n\tfmt.Println(res.Status, string(answer))\n}")
	return b.String()
}

// headerEntries are the request's headers as "name": value entries of a JavaScript object or
// a Python dict, the key's value written as key.
func (req sampleRequest) headerEntries(key string) []string {
	var entries []string
	for _, h := range req.headers {
		value := strconv.Quote(h[1])
		if headerHoldsKey(h) {
			value = key
		}
		entries = append(entries, strconv.Quote(h[0])+": "+value)
	}
	return entries
}

func (req sampleRequest) js() string {
	var b strings.Builder
	headers := req.headerEntries("`Bearer ${process.env.SANDBOX_KEY}`")
	fmt.Fprintf(&b, "const res = await fetch(%q, {\n  method: %q,\n  headers: {%s},\n", req.target, req.method, strings.Join(headers, ", "))
	if req.body != "" {
		fmt.Fprintf(&b, "  body: %s,\n", jsString(req.body))
	}
	b.WriteString("});\nconsole.log(res.status, await res.text());")
	return b.String()
}

func (req sampleRequest) python() string {
	headers := req.headerEntries(`"Bearer " + os.environ["SANDBOX_KEY"]`)
	data := ""
	if req.body != "" {
		data = ", data=" + pyBytes(req.body)
	}
	return fmt.Sprintf("import os, urllib.error, urllib.request\n\nreq = urllib.request.Request(%q, method=%q%s, headers={%s})\n", req.target, req.method, data, strings.Join(headers, ", ")) +
		"try:\n    res = urllib.request.urlopen(req)\nexcept urllib.error.HTTPError as err:  # 4xx and 5xx: the problem\n    res = err\nprint(res.status, res.read().decode())"
}

// goString is s as a Go string literal: raw when it can be.
func goString(s string) string {
	if !strings.Contains(s, "`") {
		return "`" + s + "`"
	}
	return strconv.Quote(s)
}

// jsString is s as a JavaScript string literal.
func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// pyBytes is s as a Python bytes literal (UTF-8, escaped).
func pyBytes(s string) string {
	var b strings.Builder
	b.WriteString("b'")
	for _, c := range []byte(s) {
		switch {
		case c == '\'' || c == '\\':
			b.WriteString(`\` + string(c))
		case c < 0x20 || c >= 0x7f:
			fmt.Fprintf(&b, `\x%02x`, c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String() + "'"
}

// referenceMarkdown is the reference in Markdown, each anchor a heading.
func referenceMarkdown(d referenceData) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "# The Shipping API sandbox's reference\n\nEvery operation of %s/v1 (the OpenAPI document: %s/v1/openapi.json), every schema, every error code, the findings, the conformance rules and the exams. Each heading is an anchor of %s/reference. Send a test key as `Authorization: Bearer $SANDBOX_KEY`.\n", originMark, originMark, originMark)
	b.WriteString("\n## Operations\n")
	for _, g := range d.Groups {
		fmt.Fprintf(&b, "\n### %s\n\n%s\n", g.Tag, g.Description)
		for _, op := range g.Ops {
			mdOperation(&b, op)
		}
	}
	b.WriteString("\n## Shared answers\n")
	for _, r := range d.Responses {
		fmt.Fprintf(&b, "\n### response-%s\n\n%s\n", r.Name, r.Description)
		mdMedia(&b, r.Types, "")
	}
	b.WriteString("\n## Shared parameters\n")
	for _, p := range d.Params {
		fmt.Fprintf(&b, "\n### param-%s\n\n`%s` (%s): %s\n", p.Name, p.Param, p.In, p.Description)
	}
	b.WriteString("\n## Schemas\n")
	for _, s := range d.Schemas {
		fmt.Fprintf(&b, "\n### schema-%s\n\n%s: %s\n", s.Name, s.Type, s.Description)
		if len(s.Props) > 0 {
			b.WriteString("\n| Member | Type | Required | Description |\n|---|---|---|---|\n")
			for _, p := range s.Props {
				fmt.Fprintf(&b, "| `%s` | %s | %v | %s |\n", p.Name, mdType(p.Type), p.Required, mdCell(p.Description))
			}
		}
	}
	b.WriteString("\n## Error codes\n\nEvery error is an RFC 9457 problem (`application/problem+json`) with its `code`.\n")
	for _, e := range d.Errors {
		fmt.Fprintf(&b, "\n### error-%s\n\n%d: %s\n", e.Code, e.Status, e.Description)
	}
	b.WriteString("\n## Findings\n\nWhat GET /v1/test_helpers/findings finds in the journal.\n")
	for _, f := range d.Findings {
		fmt.Fprintf(&b, "\n### finding-%s\n\n%s. What to do: %s.\n", f.Code, f.Definition, f.Advice)
	}
	b.WriteString("\n## Conformance rules\n\nWhat `go run . check` judges a server by.\n")
	for _, r := range d.Rules {
		fmt.Fprintf(&b, "\n### rule-%s\n\n%s (%s). %s\n", r.ID, r.Title, r.Level, r.Spec)
	}
	b.WriteString("\n## Exams\n\nScenarios that grade an integration: POST /v1/test_helpers/exams.\n")
	for _, x := range d.Exams {
		fmt.Fprintf(&b, "\n### exam-%s\n\n%s (revision %d, %d s). Task: %s Given: `%s`.\n\n| Check | What it holds |\n|---|---|\n", x.Name, x.Title, x.Revision, x.Duration, x.Task, x.Given)
		for _, c := range x.Checks {
			fmt.Fprintf(&b, "| `%s` | %s |\n", c.ID, mdCell(c.Title))
		}
	}
	return []byte(b.String())
}

// mdOperation writes one operation in Markdown.
func mdOperation(b *strings.Builder, op refOp) {
	fmt.Fprintf(b, "\n#### op-%s\n\n`%s %s`: %s\n\n%s\n", op.ID, op.Method, op.Path, op.Summary, op.Description)
	switch {
	case op.Keyless:
		b.WriteString("\nNo key.\n")
	case op.Scopes != "":
		fmt.Fprintf(b, "\nScope: %s.\n", op.Scopes)
	}
	if len(op.Params) > 0 {
		b.WriteString("\n| Parameter | In | Type | Required | Example | Description |\n|---|---|---|---|---|---|\n")
		for _, p := range op.Params {
			description := mdCell(p.Description)
			if p.Shared != "" {
				description += " See [param-" + p.Shared + "](#param-" + p.Shared + ")."
			}
			fmt.Fprintf(b, "| `%s` | %s | %s | %v | `%s` | %s |\n", p.Name, p.In, mdCell(p.Type), p.Required, mdCell(p.Example), description)
		}
	}
	if op.Body != nil {
		fmt.Fprintf(b, "\nBody: %s.\n", mdType(op.Body.Schema))
		for _, ex := range op.Body.Examples {
			fmt.Fprintf(b, "\nExample `%s`%s:\n\n```json\n%s\n```\n", ex.Name, mdSummary(ex.Summary), ex.JSON)
		}
	}
	b.WriteString("\nAnswers:\n\n")
	for _, r := range op.Responses {
		if r.Ref != "" {
			fmt.Fprintf(b, "- %s: [%s](#response-%s). %s\n", r.Status, r.Ref, r.Ref, r.Description)
			continue
		}
		fmt.Fprintf(b, "- %s: %s\n", r.Status, r.Description)
		mdMedia(b, r.Types, "  ")
	}
	for _, s := range op.Samples {
		fmt.Fprintf(b, "\n%s:\n\n```%s\n%s\n```\n", s.Lang, map[string]string{"curl": "sh", "Go": "go", "JavaScript": "js", "Python": "python"}[s.Lang], s.Code)
	}
}

func mdMedia(b *strings.Builder, types []refMedia, indent string) {
	for _, m := range types {
		fmt.Fprintf(b, "%s- `%s`: %s\n", indent, m.ContentType, mdType(m.Schema))
		for _, ex := range m.Examples {
			fmt.Fprintf(b, "%s  - example `%s`%s: `%s`\n", indent, ex.Name, mdSummary(ex.Summary), strings.ReplaceAll(ex.JSON, "`", "'"))
		}
	}
}

func mdType(t refType) string {
	if t.Name != "" {
		return "[" + t.Text + "](#schema-" + t.Name + ")"
	}
	return mdCell(t.Text)
}

func mdSummary(s string) string {
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}

// mdCell is text fit for a Markdown table's cell: one line, its bars escaped.
func mdCell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}

// llmsText is /llms.txt: what the sandbox is, its base URL, the first three calls, and links
// to the Markdown reference, the document and every page.
func llmsText(d referenceData) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "# Shipping API sandbox (v1, developer preview)\n\n> The local sandbox of the Shipment Tracking and Imported Orders API: tracking reads (by shipment id or tracking number) and imported-order reads (a paged, filtered list, and one by id), rule for rule and error for error as specified, with test helpers (a sandbox clock, sandboxes on demand, a journal and its findings, exams that grade an integration). No carrier or marketplace is called.\n\n")
	fmt.Fprintf(&b, "Base URL: %s/v1. Send a test key as `Authorization: Bearer <key>`; the sandbox prints its keys when it starts (`sk_test_sandbox_all` has both scopes in the default dataset). %d operations; every answer is JSON, every error an RFC 9457 problem with a `code`.\n\n", originMark, d.Operations)
	b.WriteString("## First calls\n\n")
	fmt.Fprintf(&b, "1. `curl -H \"Authorization: Bearer $SANDBOX_KEY\" %s/v1/orders`: a page of imported orders, newest first; `pagination.next_cursor` pages on.\n", originMark)
	fmt.Fprintf(&b, "2. `curl -H \"Authorization: Bearer $SANDBOX_KEY\" %s/v1/orders/ord_sbx_0001`: one order (the default dataset's).\n", originMark)
	fmt.Fprintf(&b, "3. `curl -H \"Authorization: Bearer $SANDBOX_KEY\" %s/v1/shipments/shp_sbx_spring/tracking`: a shipment's tracking view, by its id.\n\n", originMark)
	b.WriteString("## Reference\n\n")
	fmt.Fprintf(&b, "- [The reference in Markdown](%s/reference.md): every operation with its parameters, answers, examples and a request in curl, Go, JavaScript and Python; every schema, error code, finding, conformance rule and exam\n", originMark)
	fmt.Fprintf(&b, "- [The OpenAPI 3.1 document](%s/v1/openapi.json)\n", originMark)
	fmt.Fprintf(&b, "- [The reference page](%s/reference): the same, for a browser\n\n## Docs\n\n", originMark)
	pages, _ := fs.Glob(embeddedPages, "docs/*.md")
	for _, name := range append([]string{"README.md"}, pages...) {
		text, _ := embeddedPages.ReadFile(name)
		heading, _, _ := strings.Cut(string(text), "\n")
		fmt.Fprintf(&b, "- [%s](%s/%s): %s\n", name, originMark, name, strings.TrimPrefix(heading, "# "))
	}
	b.WriteString("\n## Optional\n\n")
	fmt.Fprintf(&b, "- [MCP](%s/docs/mcp.md): the same sandbox as tools, at POST %s/mcp or `go run . mcp` over stdio\n", originMark, originMark)
	return []byte(b.String())
}

// The reference's routes, keyless and never journaled, as / is.

// serveReference answers GET /reference: the page.
func (s *server) serveReference(w http.ResponseWriter, r *http.Request, c *call) {
	w.Header().Set("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:; form-action 'none'; base-uri 'none'; frame-ancestors 'self'")
	s.serveMarked(w, r, "text/html; charset=utf-8", s.reference.html)
}

// serveReferenceMarkdown answers GET /reference.md.
func (s *server) serveReferenceMarkdown(w http.ResponseWriter, r *http.Request, c *call) {
	s.serveMarked(w, r, "text/markdown; charset=utf-8", s.reference.markdown)
}

// serveLLMs answers GET /llms.txt.
func (s *server) serveLLMs(w http.ResponseWriter, r *http.Request, c *call) {
	s.serveMarked(w, r, "text/plain; charset=utf-8", s.reference.llms)
}

// serveMarked answers a prepared answer with the request's origin where originMark stands.
func (s *server) serveMarked(w http.ResponseWriter, r *http.Request, contentType string, marked []byte) {
	writeBody(w, http.StatusOK, contentType, bytes.ReplaceAll(marked, []byte(originMark), []byte(originOf(r, s.origin))))
}

// servePage answers GET /README.md and /docs/{page}.md: an embedded page, as the MCP
// resources serve it; any other name is 404.
func (s *server) servePage(w http.ResponseWriter, r *http.Request, c *call) {
	name := "README.md"
	if page := r.PathValue("page"); page != "" {
		name = "docs/" + page
	}
	text, err := embeddedPages.ReadFile(name)
	if err != nil || !strings.HasSuffix(name, ".md") || strings.Contains(strings.TrimPrefix(name, "docs/"), "/") {
		s.routeNotFound(w, r, c)
		return
	}
	writeBody(w, http.StatusOK, "text/markdown; charset=utf-8", text)
}

// ===== mcp: POST /mcp, who may knock, and the envelope =====

// A coding agent's door: the Model Context Protocol (MCP). One implementation, reached two
// ways: POST /mcp on the sandbox's own listener (MCP's Streamable HTTP, answered as
// application/json only: no event streams, no sessions, Mcp-Session-Id never sent and
// ignored), and go run . mcp, which carries newline-delimited JSON-RPC between standard input
// and output and that /mcp, in this process or, with -base-url, in another's. In the order a
// POST meets it: who may knock and the envelope; the revision it speaks (the legacy
// handshake's 2024-11-05 to 2025-11-25, or the stateless 2026-07-28's headers and _meta) and
// the method; the tools, one table; a tool's call, its API requests (made in this process
// with the caller's key through the doorway: authenticated, rate-limited, journaled and
// judged as a client's) and its result; the resources; then stdio and the bridge, the
// transports over the door. Nothing an agent does here a client could not.

// mcpDoor is the door, built once at start: the tools with their schemas, the resources.
type mcpDoor struct {
	doorway
	tools     []mcpTool
	exams     string                     // the exams a start may name, from the document
	listed    map[string]json.RawMessage // each revision's tool list, written once at start
	resources []mcpResource
}

// doorway is what the door is given of the sandbox it opens, once, at start: the one way in
// for its tools' requests (the whole service in this process, as a transport), how the
// sandbox judges a caller's key, its document as an origin names it, and the settings that
// decide who may knock. The door reaches the server through nothing else.
type doorway struct {
	service      http.RoundTripper                                // the whole service, in this process: every API request of a tool, and check_server's
	knock        func(h http.Header) (*apiKey, string, *apiError) // the key a request's Authorization names, judged as the test helpers judge it, and its text
	document     func(origin string) []byte                       // GET /v1/openapi.json's answer for a request that named origin
	documentSize func(origin string) int                          // its size, known without writing it
	corsOrigin   string                                           // -cors-origin: "" for none, or * for any page
	loopback     bool                                             // the sandbox listens on loopback only
	origin       string                                           // the banner's origin: what a request names the sandbox by when its Host does not
	writeTimeout time.Duration                                    // the listener's: a call is answered before it
	mcpKey       string                                           // -mcp-key: what a request from a loopback address without Authorization acts as
	getenv       func(string) string                              // the process's environment: check_server's keys for another server
}

// JSON-RPC's error codes, and MCP's.
const (
	rpcParseError          = -32700
	rpcInvalidRequest      = -32600
	rpcMethodNotFound      = -32601
	rpcInvalidParams       = -32602
	rpcInternalError       = -32603
	rpcTransportError      = -32000 // the envelope refused (a content type, an Origin, a Host), as MCP's SDKs answer it
	rpcResourceNotFound    = -32002 // a legacy revision's unknown resource
	rpcHeaderMismatch      = -32020
	rpcUnsupportedRevision = -32022
)

// mcpAllowHeaders are the header fields a browser's page may send to /mcp.
const mcpAllowHeaders = "Authorization, Content-Type, MCP-Protocol-Version, Mcp-Method, Mcp-Name"

// serveHTTP answers POST /mcp, its body read (within the body cap) when it arrived: who may
// knock (the Host and the Origin a page elsewhere could forge, then the key), the envelope
// (one JSON-RPC message as application/json), then the message: a notification or a
// response is taken (202), a request answered. It returns the key the request acted as (nil
// when refused), and whether its answer was cut (the write timeout, a client gone), so that
// the log never says 200 of it.
func (d *mcpDoor) serveHTTP(w http.ResponseWriter, r *http.Request, body []byte, arrived time.Time) (caller *apiKey, cut bool) {
	if why := d.refusal(r); why != "" {
		writeRPC(w, http.StatusForbidden, rpcError(nil, rpcTransportError, why, nil))
		return nil, false
	}
	caller, key, err := d.callerKey(r)
	if err != nil {
		writeProblem(w, w.Header().Get("Request-Id"), err)
		return nil, false
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		writeRPC(w, http.StatusUnsupportedMediaType, rpcError(nil, rpcTransportError, "Unsupported Media Type: send one JSON-RPC message with Content-Type: application/json.", nil))
		return caller, false
	}
	msg, refused := readRPC(body)
	switch {
	case refused != nil:
		writeRPC(w, http.StatusBadRequest, refused)
	case msg.id == nil:
		w.WriteHeader(http.StatusAccepted)
	default:
		status, answer := d.answer(&mcpCall{ctx: r.Context(), arrived: arrived, key: key, header: r.Header, origin: originOf(r, d.origin), host: r.Host, remote: r.RemoteAddr}, msg)
		writeRPC(w, status, answer)
		err := http.NewResponseController(w).Flush()
		cut = err != nil && !errors.Is(err, http.ErrNotSupported)
	}
	return caller, cut
}

// refusal says why a request may not knock, "" when it may: an Origin that is neither a
// loopback page's nor -cors-origin's; while the sandbox listens on loopback, a Host that is
// not a loopback name (a page elsewhere reaching it under its own name: DNS rebinding).
func (d *mcpDoor) refusal(r *http.Request) string {
	if o := r.Header.Get("Origin"); o != "" && !loopbackOrigin(o) && d.corsOrigin != "*" && d.corsOrigin != o {
		return "Forbidden: Origin " + strconv.Quote(cutField(o, 64)) + " may not call this door: a page of another origin (-cors-origin names the one that may)."
	}
	if host, _, ok := splitHostPort(strings.ToLower(r.Host)); d.loopback && (!ok || !namesLoopback(host)) {
		return "Forbidden: Host " + strconv.Quote(cutField(r.Host, 64)) + " is not a loopback name, and the sandbox listens on loopback: a page elsewhere may not reach this door under a name of its own (DNS rebinding)."
	}
	return ""
}

// loopbackOrigin reports whether o is the origin of a page of this machine.
func loopbackOrigin(o string) bool {
	u, err := url.Parse(o)
	if err != nil || u.Scheme != "http" && u.Scheme != "https" {
		return false
	}
	return namesLoopback(strings.ToLower(u.Hostname()))
}

// callerKey is the key a request acts as: its Authorization's, as the sandbox judges it
// (knock); without one, a request from a loopback address acts as -mcp-key when it is set.
// The tools act as the key alone.
func (d *mcpDoor) callerKey(r *http.Request) (*apiKey, string, *apiError) {
	h := r.Header
	if h.Get("Authorization") == "" && d.mcpKey != "" && loopbackRemote(r.RemoteAddr) {
		h = http.Header{"Authorization": {"Bearer " + d.mcpKey}}
	}
	return d.knock(h)
}

// loopbackRemote reports whether a client's address is this machine's loopback.
func loopbackRemote(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	ip, perr := netip.ParseAddr(host)
	return err == nil && perr == nil && ip.IsLoopback()
}

// rpcMessage is one JSON-RPC message: a request (an id and a method), a notification (a
// method, no id) or a response (an id, a result or an error).
type rpcMessage struct {
	id     json.RawMessage // nil: a notification, or a response
	method string
	params map[string]json.RawMessage
	raw    map[string]json.RawMessage
}

// readRPC reads one JSON-RPC message off a body, or the answer that refuses it: unparsable
// or not UTF-8, as the API refuses it (-32700: an id that is not UTF-8 could not be echoed), a
// batch or anything but a message (-32600), each with id null.
func readRPC(body []byte) (*rpcMessage, []byte) {
	trimmed := bytes.TrimSpace(body)
	var raw map[string]json.RawMessage
	err := json.Unmarshal(trimmed, &raw)
	switch {
	case !utf8.Valid(trimmed):
		return nil, rpcError(nil, rpcParseError, "Parse error: the body is not UTF-8, as JSON must be.", nil)
	case err != nil && !json.Valid(trimmed):
		return nil, rpcError(nil, rpcParseError, "Parse error: the body is not JSON.", nil)
	case trimmed[0] == '[':
		return nil, rpcError(nil, rpcInvalidRequest, "Invalid Request: a batch (a JSON array) is not taken; send one message a request.", nil)
	case err != nil || string(raw["jsonrpc"]) != `"2.0"`:
		return nil, rpcError(nil, rpcInvalidRequest, `Invalid Request: a JSON-RPC 2.0 message is one object with "jsonrpc":"2.0".`, nil)
	}
	msg := &rpcMessage{raw: raw}
	method, hasMethod := raw["method"]
	id, hasID := raw["id"]
	switch {
	case !hasMethod && (raw["result"] != nil || raw["error"] != nil) && hasID:
		return msg, nil // a response: taken
	case !hasMethod || json.Unmarshal(method, &msg.method) != nil:
		return nil, rpcError(nil, rpcInvalidRequest, "Invalid Request: a request or a notification names its method, a string.", nil)
	case hasID && !validID(id):
		return nil, rpcError(nil, rpcInvalidRequest, "Invalid Request: an id is a string or a number.", nil)
	case hasID:
		msg.id = id
	}
	if p, ok := raw["params"]; ok && json.Unmarshal(p, &msg.params) != nil {
		if msg.id == nil {
			return msg, nil // a notification is taken whatever it holds
		}
		return nil, rpcError(msg.id, rpcInvalidRequest, "Invalid Request: params is an object.", nil)
	}
	return msg, nil
}

// validID reports whether a JSON-RPC id is a string or a number.
func validID(id json.RawMessage) bool {
	return len(id) > 0 && (id[0] == '"' || id[0] == '-' || id[0] >= '0' && id[0] <= '9')
}

// rpcError is a JSON-RPC error answer for id (nil: null).
func rpcError(id json.RawMessage, code int, message string, data any) []byte {
	e := map[string]any{"code": code, "message": message}
	if data != nil {
		e["data"] = data
	}
	return rpcEnvelope(id, "error", e)
}

// rpcEnvelope is a JSON-RPC answer for id: its result, or its error (member).
func rpcEnvelope(id json.RawMessage, member string, v any) []byte {
	if id == nil {
		id = json.RawMessage("null")
	}
	b, _ := marshalJSON(map[string]any{"jsonrpc": "2.0", "id": id, member: v})
	return b
}

// rpcResult is a JSON-RPC result for id, its members in order of name: a json.RawMessage
// among them is the door's own, compact, and goes in as it is (id, read off a message that
// was parsed whole, is a string or a number as sent).
func rpcResult(id json.RawMessage, result map[string]any) []byte {
	size := 64
	for _, v := range result {
		if raw, ok := v.(json.RawMessage); ok {
			size += len(raw) + 32
		}
	}
	b := append(append(append(make([]byte, 0, size), `{"jsonrpc":"2.0","id":`...), id...), `,"result":{`...)
	for i, name := range slices.Sorted(maps.Keys(result)) {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(appendJSONString(b, name), ':')
		if raw, ok := result[name].(json.RawMessage); ok {
			b = append(b, raw...)
		} else {
			v, _ := marshalJSON(result[name])
			b = append(b, v...)
		}
	}
	return append(b, "}}"...)
}

// writeRPC answers with a JSON-RPC body.
func writeRPC(w http.ResponseWriter, status int, body []byte) {
	writeBody(w, status, jsonContentType, body)
}

// ===== mcp: the revision, and the method =====

// The revisions the door speaks, newest first: the stateless 2026-07-28 (each request's
// _meta names its revision, and the headers repeat it), and the legacy handshake's.
var mcpRevisions = []string{"2026-07-28", "2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"}

const (
	mcpStateless    = "2026-07-28"
	mcpUnnamed      = "2025-03-26" // a legacy request without MCP-Protocol-Version
	mcpNewestLegacy = "2025-11-25" // what initialize answers a revision it does not speak
)

// The keys of a request's _meta (2026-07-28).
const (
	metaRevision     = "io.modelcontextprotocol/protocolVersion"
	metaCapabilities = "io.modelcontextprotocol/clientCapabilities"
	metaServerInfo   = "io.modelcontextprotocol/serverInfo"
)

// mcpCall is one request to the door: what it knocked with, and the revision it is answered
// in.
type mcpCall struct {
	ctx       context.Context
	arrived   time.Time   // when its request arrived: a call is answered before the listener's write timeout from then
	key       string      // the caller's key, as sent
	header    http.Header // the request's fields: its revision's headers
	origin    string      // http:// and the Host it named the sandbox by
	host      string      // its Host, the API requests' too
	remote    string      // the client's address, the API requests' too
	revision  string
	stateless bool
}

// mcpFault is a request refused before its method: its JSON-RPC code, message and data, and
// the HTTP status its revision answers it with.
type mcpFault struct {
	status, code int
	message      string
	data         any
}

// answer answers a request: its revision, then its method; the HTTP status (a stateless
// revision's error has its own; a legacy one's is 200) and the JSON-RPC body.
func (d *mcpDoor) answer(c *mcpCall, msg *rpcMessage) (int, []byte) {
	if f := c.resolveRevision(msg); f != nil {
		return f.status, rpcError(msg.id, f.code, f.message, f.data)
	}
	result, f := d.dispatch(c, msg)
	if f != nil {
		return f.status, rpcError(msg.id, f.code, f.message, f.data)
	}
	if c.stateless {
		result["resultType"] = "complete"
		meta, _ := result["_meta"].(map[string]any)
		if meta == nil {
			meta = map[string]any{}
		}
		meta[metaServerInfo] = serverInfo(c.revision)
		result["_meta"] = meta
	}
	return http.StatusOK, rpcResult(msg.id, result)
}

// resolveRevision sets the revision c is answered in: the stateless revision's when the
// request is of it (its MCP-Protocol-Version, its _meta, or server/discover), judged so (its
// _meta names its revision and the client's capabilities, and the headers repeat the body);
// else the legacy one MCP-Protocol-Version names (absent: 2025-03-26), or, for initialize,
// the one it asks for. A revision the door does not speak is refused.
func (c *mcpCall) resolveRevision(msg *rpcMessage) *mcpFault {
	header := c.header.Get("MCP-Protocol-Version")
	var meta map[string]json.RawMessage
	json.Unmarshal(msg.params["_meta"], &meta)
	_, named := meta[metaRevision]
	if header != "" && !slices.Contains(mcpRevisions, header) {
		return unsupportedRevision(header)
	}
	c.stateless = header == mcpStateless || named || msg.method == "server/discover"
	if !c.stateless {
		c.revision = cmp.Or(header, mcpUnnamed)
		if msg.method == "initialize" {
			var p struct{ ProtocolVersion string }
			json.Unmarshal(rawParams(msg), &p)
			c.revision = p.ProtocolVersion
			if !slices.Contains(mcpRevisions[1:], c.revision) {
				c.revision = mcpNewestLegacy
			}
		}
		return nil
	}
	c.revision = mcpStateless
	if statelessLacks(msg.method) {
		return nil // -32601, whatever its _meta: dispatch answers it
	}
	return c.statelessFault(msg, header, meta)
}

// statelessLacks reports whether the stateless revision lacks a method: the legacy
// handshake's initialize and ping, and prompts/* and logging/setLevel, which no revision of
// this door serves.
func statelessLacks(method string) bool {
	return method == "initialize" || method == "ping" || method == "logging/setLevel" || strings.HasPrefix(method, "prompts/")
}

// statelessFault is what refuses a request of the stateless revision: a _meta without its
// revision or the client's capabilities (-32602), a revision the door does not speak
// (-32022), headers unlike the body (-32020): MCP-Protocol-Version and _meta's revision,
// Mcp-Method and the method, Mcp-Name and the tool's name or the resource's URI.
func (c *mcpCall) statelessFault(msg *rpcMessage, header string, meta map[string]json.RawMessage) *mcpFault {
	var revision string
	var capabilities map[string]json.RawMessage
	if json.Unmarshal(meta[metaRevision], &revision) != nil || json.Unmarshal(meta[metaCapabilities], &capabilities) != nil || capabilities == nil {
		return &mcpFault{http.StatusBadRequest, rpcInvalidParams, "Invalid params: _meta must name the request's revision (" + metaRevision + ") and the client's capabilities (" + metaCapabilities + ", an object).", nil}
	}
	if revision != mcpStateless {
		return metaRevisionFault(revision)
	}
	name, mirrored := mcpName(msg)
	sentName, ok := decodeMcpName(c.header.Get("Mcp-Name"))
	switch {
	case header != revision:
		return headerMismatch("MCP-Protocol-Version " + strconv.Quote(header) + " is not the body's revision " + strconv.Quote(revision))
	case c.header.Get("Mcp-Method") != msg.method:
		return headerMismatch("Mcp-Method " + strconv.Quote(c.header.Get("Mcp-Method")) + " is not the body's method " + strconv.Quote(msg.method))
	case mirrored && (!ok || sentName != name):
		return headerMismatch("Mcp-Name " + strconv.Quote(c.header.Get("Mcp-Name")) + " is not the body's " + strconv.Quote(name))
	}
	return nil
}

func unsupportedRevision(requested string) *mcpFault {
	return &mcpFault{http.StatusBadRequest, rpcUnsupportedRevision, "Unsupported protocol version " + strconv.Quote(cutField(requested, 64)) + ": this door speaks " + strings.Join(mcpRevisions, ", ") + ".",
		map[string]any{"supported": mcpRevisions, "requested": requested}}
}

// metaRevisionFault refuses a _meta that names a revision other than the stateless one: a
// legacy revision is negotiated by initialize, never named in _meta.
func metaRevisionFault(requested string) *mcpFault {
	message := "Unsupported protocol version " + strconv.Quote(cutField(requested, 64)) + " in _meta: _meta names " + mcpStateless + ", the stateless revision"
	if slices.Contains(mcpRevisions[1:], requested) {
		message += "; " + requested + " is a legacy revision, negotiated by initialize (then named by MCP-Protocol-Version), never in _meta"
	}
	return &mcpFault{http.StatusBadRequest, rpcUnsupportedRevision, message + ".", map[string]any{"supported": []string{mcpStateless}, "requested": requested}}
}

func headerMismatch(why string) *mcpFault {
	return &mcpFault{http.StatusBadRequest, rpcHeaderMismatch, "Header mismatch: " + why + ".", nil}
}

// mcpName is what a request's Mcp-Name mirrors: a tool's name (tools/call) or a resource's
// URI (resources/read); false for the methods that mirror none.
func mcpName(msg *rpcMessage) (string, bool) {
	var name string
	switch msg.method {
	case "tools/call":
		json.Unmarshal(msg.params["name"], &name)
	case "resources/read":
		json.Unmarshal(msg.params["uri"], &name)
	default:
		return "", false
	}
	return name, true
}

// decodeMcpName is an Mcp-Name value as sent: plain, or a =?base64?...?= sentinel (a name
// that is not plain visible ASCII).
func decodeMcpName(v string) (string, bool) {
	inner, ok := strings.CutPrefix(v, "=?base64?")
	if !ok {
		return v, true
	}
	inner, ok = strings.CutSuffix(inner, "?=")
	b, err := base64.StdEncoding.DecodeString(inner)
	return string(b), ok && err == nil
}

// encodeMcpName is name as an Mcp-Name value: itself when it is visible ASCII, else the
// =?base64?...?= sentinel.
func encodeMcpName(name string) string {
	for i := 0; i < len(name); i++ {
		if name[i] < 0x21 || name[i] > 0x7e {
			return "=?base64?" + base64.StdEncoding.EncodeToString([]byte(name)) + "?="
		}
	}
	return name
}

// rawParams is a request's params as sent, {} when it has none.
func rawParams(msg *rpcMessage) []byte {
	if p := msg.raw["params"]; p != nil {
		return p
	}
	return []byte("{}")
}

// dispatch answers a request by its method: initialize and ping are the legacy handshake's
// (the stateless revision lacks them: -32601, 404), server/discover the stateless one's; the
// tools' and the resources' methods are every revision's. No revision serves prompts/* or
// logging/setLevel (no prompts, no log levels): -32601.
func (d *mcpDoor) dispatch(c *mcpCall, msg *rpcMessage) (map[string]any, *mcpFault) {
	switch {
	case msg.method == "initialize" && !c.stateless:
		return d.initialize(c), nil
	case msg.method == "ping" && !c.stateless:
		return map[string]any{}, nil
	case msg.method == "server/discover" && c.stateless:
		return d.discover(c), nil
	case msg.method == "tools/list":
		return d.listTools(c), nil
	case msg.method == "tools/call":
		return d.callTool(c, msg)
	case msg.method == "resources/list":
		return d.listResources(c), nil
	case msg.method == "resources/read":
		return d.readResource(c, msg)
	case msg.method == "resources/templates/list":
		return c.cached(map[string]any{"resourceTemplates": []any{}}), nil
	}
	status := http.StatusOK
	if c.stateless {
		status = http.StatusNotFound
	}
	return nil, &mcpFault{status, rpcMethodNotFound, "Method not found: " + strconv.Quote(cutField(msg.method, 64)) + " in revision " + c.revision + ".", nil}
}

// mcpCapabilities are what the door offers: tools and resources, no prompts.
var mcpCapabilities = map[string]any{"tools": map[string]any{}, "resources": map[string]any{}}

// serverInfo is the door's identity as revision sees it (a title from 2025-06-18).
func serverInfo(revision string) map[string]any {
	info := map[string]any{"name": "shipping-api-sandbox", "version": "v1-developer-preview"}
	if revision >= "2025-06-18" {
		info["title"] = "Shipping API sandbox"
	}
	return info
}

// initialize answers the legacy handshake in the revision asked for (or the newest legacy
// one).
func (d *mcpDoor) initialize(c *mcpCall) map[string]any {
	return map[string]any{"protocolVersion": c.revision, "capabilities": mcpCapabilities, "serverInfo": serverInfo(c.revision), "instructions": d.instructions(c)}
}

// readWorld answers server/discover: the revisions the door speaks, newest first, what it
// offers, and how to start.
func (d *mcpDoor) discover(c *mcpCall) map[string]any {
	return c.cached(map[string]any{"supportedVersions": mcpRevisions, "capabilities": mcpCapabilities, "instructions": d.instructions(c)})
}

// cached is a result the stateless revision may cache: an hour, for anyone.
func (c *mcpCall) cached(result map[string]any) map[string]any {
	if c.stateless {
		result["ttlMs"], result["cacheScope"] = 3600000, "public"
	}
	return result
}

// ===== mcp: the tools, one table =====

// mcpTool is a tool of the door: what an agent reads of it (its name, title, what it does,
// its arguments and answers, the hints a host asks for) and how a call is answered (call):
// the API's request of its operation, or the kit's run. Its method, paths and listed
// description are its operations' in the document, read once at start.
type mcpTool struct {
	name, title, summary                         string   // summary: what it does, after its operations' method and path
	ops                                          []string // the document's operations it requests, one a path: the first whose path members are sent
	call                                         toolCall
	success                                      func() map[string]any // its success's schema where no operation gives one (the kit's report); nil: its operation's
	members                                      []mcpMember
	exactlyOne                                   []string // members of which the call sends one (judged at the call)
	readOnly, destructive, idempotent, openWorld bool
	// Built at start, from the document.
	method, description string
	paths               []string // the requests' paths, {member}s to fill in
	input, output       map[string]any
}

// toolCall answers a tool's call, its arguments judged: the API's answer, or the door's own.
type toolCall func(d *mcpDoor, c *mcpCall, t *mcpTool, args []toolArgument) toolAnswer

// mcpMember is an argument of a tool: where the document describes it (a parameter, a
// schema's property, an operation's own parameter; or an inline schema), whether the call
// must send it, and where the API's request carries it: in its path, query or body, in a
// header (of that name), or as the request's key, its Prefer, or a Prefer run tag.
type mcpMember struct {
	name     string
	from     string // "parameters/Name", "schemas/Name/property", "op/operationId/parameter"; "" for inline
	inline   string // the JSON schema, when from is ""
	in       string // path, query, body, header, key, prefer or tag
	header   string // the header a member in a header is sent as
	required bool
}

// The members a client's request carries beside its own (the key it is made with, its
// Prefer, a run tag), and the Idempotency-Key each write takes.
var (
	keyMember    = mcpMember{name: "key", in: "key", inline: `{"type":"string","description":"A test key of this sandbox to act as (a sandbox's, say); default: the caller's. A live key is refused (503)."}`}
	preferMember = mcpMember{name: "prefer", in: "prefer", inline: `{"type":"string","description":"Sent as the Prefer header: code=429|500|502|503 (a simulated answer), code=503; times=2 (failing only the first tries), delay=MS, clock=\"start+90s\" (the instant this request is judged at)."}`}
	runMember    = mcpMember{name: "run", in: "tag", inline: `{"type":"string","pattern":"^[A-Za-z0-9._-]{1,64}$","description":"Sent as Prefer: run=\"...\": tags the request, so that get_requests and get_findings of that run judge it apart."}`}
	idemMember   = mcpMember{name: "idempotency_key", from: "schemas/IdempotencyKey", in: "header", header: "Idempotency-Key", required: true}
	// gradeKeyMember is who reads a grade: the attempt's key, or the key that started it.
	gradeKeyMember = mcpMember{name: "key", in: "key", inline: `{"type":"string","description":"The attempt's key (start_exam's key), or the key that started the attempt; default: the caller's, which started it when start_exam was called without a key. Any other key reads 404."}`}
	// attemptKeyMember is an exam attempt's key, which its answer is sent with.
	attemptKeyMember = mcpMember{name: "key", in: "key", required: true, inline: `{"type":"string","description":"The attempt's key, as start_exam answered it: an answer is sent with it."}`}
)

// asClient is a tool's own members, then those a client's request carries: its key, its
// Prefer, its run tag.
func asClient(own ...mcpMember) []mcpMember { return append(own, keyMember, preferMember, runMember) }

// mcpToolTable is the door's tools, the one table that tools/list, the instructions,
// docs/mcp.md's table and the tests read.
var mcpToolTable = []mcpTool{
	{name: "get_tracking", title: "A shipment's tracking view", ops: []string{"getShipmentTracking", "getTrackingByNumber"}, call: askAPI, readOnly: true,
		summary: "a shipment's tracking view (its events, oldest first, in UTC) by its id or by its primary tracking number; send one of the two.", exactlyOne: []string{"shipment_id", "tracking_number"},
		members: asClient(mcpMember{name: "shipment_id", from: "parameters/ShipmentId", in: "path"}, mcpMember{name: "tracking_number", from: "parameters/TrackingNumber", in: "path"})},
	{name: "list_orders", title: "A page of imported orders", ops: []string{"listOrders"}, call: askAPI, readOnly: true,
		summary: "a page of imported orders, newest first, with its pagination; next_cursor pages on (with the same filters).",
		members: asClient(mcpMember{name: "limit", from: "parameters/Limit", in: "query"}, mcpMember{name: "cursor", from: "parameters/Cursor", in: "query"}, mcpMember{name: "status", from: "parameters/Status", in: "query"},
			mcpMember{name: "created_from", from: "parameters/CreatedFrom", in: "query"}, mcpMember{name: "created_to", from: "parameters/CreatedTo", in: "query"})},
	{name: "get_order", title: "One imported order", ops: []string{"getOrder"}, call: askAPI, readOnly: true,
		summary: "one imported order, its six fields.",
		members: asClient(mcpMember{name: "id", from: "parameters/OrderId", in: "path", required: true})},
	{name: "create_sandbox", title: "Make a sandbox: an account of your own", ops: []string{"createSandbox"}, call: askAPI, idempotent: true,
		summary: "an account of your own, with keys made for it: a copy of a dataset account (template; acct_sync is a marketplace that moves) or the records sent. Its keys act in it (the key argument of the other tools).",
		members: asClient(mcpMember{name: "template", from: "schemas/SandboxRequest/template", in: "body"}, mcpMember{name: "shipments", from: "schemas/SandboxRequest/shipments", in: "body"},
			mcpMember{name: "orders", from: "schemas/SandboxRequest/orders", in: "body"}, mcpMember{name: "keys", from: "schemas/SandboxRequest/keys", in: "body"}, mcpMember{name: "profile", from: "schemas/SandboxRequest/profile", in: "body"}, idemMember)},
	{name: "delete_sandbox", title: "Forget a sandbox", ops: []string{"deleteSandbox"}, call: askAPI, destructive: true,
		summary: "forgets the sandbox at once, with a key of its own (the key argument); its keys answer 401 from then on.",
		members: asClient(mcpMember{name: "account", from: "parameters/SandboxAccount", in: "path", required: true})},
	{name: "book_shipment", title: "Book a shipment for an order", ops: []string{"createShipment"}, call: askAPI, idempotent: true,
		summary: "a shipment created in your sandbox (a key of it) at the request's instant, linking the order it names (order_id); a second link of one order is 409.",
		members: asClient(mcpMember{name: "id", from: "schemas/ShipmentRequest/id", in: "body"}, mcpMember{name: "reference", from: "schemas/ShipmentRequest/reference", in: "body", required: true},
			mcpMember{name: "tracking_number", from: "schemas/ShipmentRequest/tracking_number", in: "body"}, mcpMember{name: "parcel_tracking_numbers", from: "schemas/ShipmentRequest/parcel_tracking_numbers", in: "body"},
			mcpMember{name: "order_id", from: "schemas/ShipmentRequest/order_id", in: "body"}, mcpMember{name: "events", from: "schemas/ShipmentRequest/events", in: "body"}, idemMember)},
	{name: "add_shipment_events", title: "Move a shipment: carrier events arrive", ops: []string{"addShipmentEvents"}, call: askAPI, idempotent: true,
		summary: "carrier events arrive for a shipment of your sandbox at the request's instant: events (raw, each with a timestamp, an after from now, or neither), or status (one event of that status now) with its location.",
		members: asClient(mcpMember{name: "shipment_id", from: "op/addShipmentEvents/id", in: "path", required: true}, mcpMember{name: "events", from: "schemas/ShipmentEventsRequest/events", in: "body"},
			mcpMember{name: "status", from: "schemas/ShipmentStatusRequest/status", in: "body"}, mcpMember{name: "location", from: "schemas/ShipmentStatusRequest/location", in: "body"}, idemMember)},
	{name: "get_clock", title: "The sandbox clock", ops: []string{"getClock"}, call: askAPI, readOnly: true,
		summary: "the key's account's sandbox clock: frozen, running from an instant, or following the wall clock, and its reading.", members: asClient()},
	{name: "set_clock", title: "Move the sandbox clock", ops: []string{"setClock"}, call: askAPI,
		summary: "freeze the key's account's clock at an instant (frozen_time; null: follow the wall clock again), or set it running from one (run_from); send one of the two.",
		members: asClient(mcpMember{name: "frozen_time", from: "schemas/ClockRequest/frozen_time", in: "body"}, mcpMember{name: "run_from", from: "schemas/ClockRequest/run_from", in: "body"})},
	{name: "get_timeline", title: "What moves, around now", ops: []string{"getTimeline"}, call: askAPI, readOnly: true,
		summary: "what the account's data schedules around the request's instant: the last 10 things that happened and the next 10 to come.", members: asClient()},
	{name: "get_requests", title: "The journal: what your requests showed", ops: []string{"getRequests"}, call: askAPI, readOnly: true,
		summary: "the journal of the key's account, oldest first: each request's target, status, code, instant and the ids it showed (run: only a tagged run's).",
		members: []mcpMember{{name: "run", from: "parameters/JournalRun", in: "query"}, {name: "limit", from: "parameters/JournalLimit", in: "query"}, keyMember, preferMember}},
	{name: "get_findings", title: "The findings: traps your requests fell into", ops: []string{"getFindings"}, call: askAPI, readOnly: true,
		summary: "the traps the journal's requests show the integration fell into (retry_too_soon, missed_import, stale_order, ambiguous_number, blind_retry), each with what to change (run: only a tagged run's).",
		members: []mcpMember{{name: "run", from: "parameters/JournalRun", in: "query"}, keyMember, preferMember}},
	{name: "list_exams", title: "The exams: scenarios that grade an integration", ops: []string{"listExams"}, call: askAPI, readOnly: true,
		summary: "the exams built into the sandbox ({exams}): each a named, versioned scenario of the spec's traps, with its task, what it gives, and the checks its grade holds. No sandbox is needed to take one: start_exam makes the attempt's own.",
		members: []mcpMember{keyMember, preferMember}},
	{name: "start_exam", title: "Start an exam: an attempt graded at its end", ops: []string{"startExam"}, call: askAPI, idempotent: true,
		summary: "an attempt of an exam ({exams}), in a sandbox of its own (create_sandbox is not needed): its result holds the task, what it gives (tracking: the consignments given, each a shipment_id and the tracking_number its label shows), the attempt's key (the key argument of the other tools; 10 requests a second), its variant (the world drawn for it) and its deadline. Read what the task follows at least every {window} (times scale) until the deadline, then answer with answer_exam (booking takes no answer: it is graded at its deadline), and read the grade with grade_exam. scale stretches every instant for a client as slow as an agent calling tools (10: 120 s, a read every 30 s); variant takes a failing attempt's world again.",
		members: []mcpMember{{name: "exam", from: "schemas/ExamRequest/exam", in: "body", required: true}, {name: "revision", from: "schemas/ExamRequest/revision", in: "body"},
			{name: "scale", from: "schemas/ExamRequest/scale", in: "body"}, {name: "variant", from: "schemas/ExamRequest/variant", in: "body"}, idemMember, keyMember, preferMember}},
	{name: "answer_exam", title: "Answer an attempt, and grade it", ops: []string{"answerExam"}, call: askAPI, idempotent: true,
		summary: "the attempt's answer once its deadline has passed (orders for order-sync, consignments for tracking), with the attempt's key; its grade at once, each check with its evidence. 409 exam_running says how long to wait.", exactlyOne: []string{"orders", "consignments"},
		members: []mcpMember{{name: "id", from: "parameters/ExamId", in: "path", required: true}, {name: "orders", from: "schemas/ExamAnswer/orders", in: "body"},
			{name: "consignments", from: "schemas/ExamAnswer/consignments", in: "body"}, idemMember, attemptKeyMember}},
	{name: "grade_exam", title: "An attempt's grade", ops: []string{"getExamGrade"}, call: askAPI, readOnly: true,
		summary: "the attempt's grade as its clock stands (pending until it is computed), each check with a sentence to act on and the journal seqs it cites (get_requests with the attempt's key reads them); read with the attempt's key or the key that started it.",
		members: []mcpMember{{name: "id", from: "parameters/ExamId", in: "path", required: true}, gradeKeyMember}},
	{name: "check_server", title: "Check a server against the spec", call: checkServer, success: reportSchema, readOnly: true, openWorld: true,
		summary: "The conformance kit (go run . check): a server judged by the spec's rules over HTTP, its JSON report. Without base_url, this sandbox, with your key; a base_url on this machine only (a loopback address), with the keys of the sandbox's environment (SANDBOX_CHECK_KEY and the others), never keys from arguments. It leaves the server as it found it: the two sandboxes it makes there, it deletes.",
		members: []mcpMember{{name: "base_url", inline: `{"type":"string","description":"The server under check: the API's base, an http URL of a loopback address (127.0.0.1, localhost, [::1]), such as http://127.0.0.1:8181/v1. Absent: this sandbox."}`},
			{name: "rules", inline: `{"type":"string","description":"Comma-separated rule ids, or prefixes ending in * such as tracking.* (default: every rule)."}`},
			{name: "profile", inline: `{"type":"string","enum":["sandbox","domain_adapter"],"description":"The spec's stated difference to expect: an ambiguous tracking number is 404 from a sandbox, 409 from the domain adapter."}`},
			{name: "mode", inline: `{"type":"string","enum":["safe","full"],"description":"safe (default), or full to add the rules that load the server (its rate limit)."}`}}},
}

// tool is the door's tool of this name, or nil.
func (d *mcpDoor) tool(name string) *mcpTool {
	for i := range d.tools {
		if d.tools[i].name == name {
			return &d.tools[i]
		}
	}
	return nil
}

// newMCPDoor builds the door once, at start: each tool's requests, description, and input
// and output schemas from the document (its $refs inlined), and the resources.
func newMCPDoor(w doorway) (*mcpDoor, error) {
	table, err := mcpTable()
	if err != nil {
		return nil, err
	}
	d := *table // its tools, lists and resources shared: no door changes them
	d.doorway = w
	return &d, nil
}

// mcpTable is what of a door the document decides, made once for the process (a test makes
// hundreds of servers): its tools, their schemas read off the document, the exams a start may
// name, its resources and each revision's tool list.
var mcpTable = sync.OnceValues(func() (*mcpDoor, error) {
	var doc map[string]any
	if err := json.Unmarshal(openAPIDocument, &doc); err != nil {
		return nil, err
	}
	d := &mcpDoor{tools: slices.Clone(mcpToolTable), exams: composed(doc, "{exams}")}
	for i := range d.tools {
		t := &d.tools[i]
		err := t.readOperations(doc)
		if err == nil {
			t.input, err = inputSchema(doc, t)
		}
		if err == nil {
			t.output, err = outputSchema(doc, t)
		}
		if err != nil {
			return nil, fmt.Errorf("the MCP tool %s: %w", t.name, err)
		}
	}
	resources, err := mcpResources()
	d.resources = resources
	if err != nil {
		return nil, err
	}
	return d, d.listEach()
})

// readOperations reads the tool's requests off the document: each operation's method and
// path (under the servers' base path, its parameters renamed as the tool's members), and the
// description the tool is listed with, which begins with them.
func (t *mcpTool) readOperations(doc map[string]any) error {
	t.summary = composed(doc, t.summary)
	t.description = t.summary
	if len(t.ops) == 0 {
		return nil
	}
	var named []string
	for _, id := range t.ops {
		method, path, op := docOperationAt(doc, id)
		if op == nil {
			return fmt.Errorf("the document has no operation %s", id)
		}
		template := docBasePath(doc) + path
		for _, m := range t.members {
			if param := m.parameterName(doc); m.in == "path" && strings.Contains(path, "{"+param+"}") {
				template = strings.ReplaceAll(template, "{"+param+"}", "{"+m.name+"}")
			}
		}
		t.method, t.paths, named = strings.ToUpper(method), append(t.paths, template), append(named, strings.ToUpper(method)+" "+docBasePath(doc)+path)
	}
	t.description = strings.Join(named, ", or ") + ": " + t.summary
	return nil
}

// composed is a summary or the instructions with the catalogue's words put in from the
// document: {exams}, the exams a start may name; {window}, how soon a read must show a change.
func composed(doc map[string]any, text string) string {
	var exams []string
	enum, _ := docNode(doc, "components", "schemas", "ExamRequest", "properties", "exam")["enum"].([]any)
	for _, x := range enum {
		exams = append(exams, fmt.Sprint(x))
	}
	return strings.NewReplacer("{exams}", strings.Join(exams, ", "), "{window}", examWindow.String()).Replace(text)
}

// parameterName is the name the document gives a member's parameter ("" for a property or an
// inline member).
func (m *mcpMember) parameterName(doc map[string]any) string {
	parts := strings.Split(m.from, "/")
	switch {
	case parts[0] == "parameters":
		name, _ := docNode(doc, "components", "parameters", parts[1])["name"].(string)
		return name
	case parts[0] == "op" && len(parts) == 3:
		return parts[2]
	}
	return ""
}

// inputSchema is a tool's arguments as one flat object: each member's schema and
// description from the document, no combinator at the top (a host refuses a tool list
// that has one), no member beyond them.
func inputSchema(doc map[string]any, t *mcpTool) (map[string]any, error) {
	properties, required := map[string]any{}, []string{}
	for _, m := range t.members {
		schema, err := memberSchema(doc, m)
		if err != nil {
			return nil, fmt.Errorf("member %s: %w", m.name, err)
		}
		properties[m.name] = schema
		if m.required {
			required = append(required, m.name)
		}
	}
	return map[string]any{"type": "object", "properties": properties, "required": required, "additionalProperties": false}, nil
}

// memberSchema is a member's schema, its $refs inlined, with the document's description.
func memberSchema(doc map[string]any, m mcpMember) (map[string]any, error) {
	if m.from == "" {
		var schema map[string]any
		err := json.Unmarshal([]byte(m.inline), &schema)
		return schema, err
	}
	parts := strings.Split(m.from, "/")
	var node, schema map[string]any
	switch parts[0] {
	case "parameters":
		node = docNode(doc, "components", "parameters", parts[1])
		schema, _ = node["schema"].(map[string]any)
	case "schemas":
		if schema = docNode(doc, "components", "schemas", parts[1]); len(parts) == 3 {
			schema = docNode(schema, "properties", parts[2])
		}
	case "op":
		node = docParameter(doc, parts[1], parts[2])
		schema, _ = node["schema"].(map[string]any)
	}
	if schema == nil {
		return nil, fmt.Errorf("the document has no %s", m.from)
	}
	out := inlined(doc, schema, 0).(map[string]any)
	if desc, ok := node["description"].(string); ok {
		out["description"] = desc
	}
	if types, ok := out["type"].([]any); ok && len(types) == 2 && slices.Contains(types, "null") { // absent already means none
		if other := types[slices.Index(types, "null")^1]; other == "array" || other == "object" {
			out["type"] = other // the MCP Inspector sends a ["array","null"] member's value as a string
		}
	}
	return out, nil
}

// outputSchema is what a tool answers: its success or a problem, both (a host checks an
// error's structured content against it too). Its success is its operation's (an empty
// object for one that answers no body, as a 204), or the tool's own (the kit's report).
func outputSchema(doc map[string]any, t *mcpTool) (map[string]any, error) {
	var success map[string]any
	if t.success != nil {
		success = t.success()
	} else if len(t.ops) > 0 {
		success = docSuccess(doc, t.ops[0])
	}
	problem := docNode(doc, "components", "schemas", "Problem")
	if success == nil || problem == nil {
		return nil, errors.New("the document has no answer of its operation")
	}
	return map[string]any{"type": "object", "anyOf": []any{terse(inlined(doc, success, 0), true), terse(inlined(doc, problem, 0), true)}}, nil
}

// terse is an output schema without the descriptions of its parts (its own kept; a property
// named description stays, its value a schema, not prose): a host
// validates against it, and the document says the rest; with them, the tool list of
// thirteen tools, each with the problem's, would weigh twice as much.
func terse(node any, top bool) any {
	switch v := node.(type) {
	case map[string]any:
		for k, x := range v {
			if _, prose := x.(string); k == "description" && prose && !top {
				delete(v, k)
			} else if k != "enum" && k != "const" {
				v[k] = terse(x, false)
			}
		}
	case []any:
		for i, x := range v {
			v[i] = terse(x, false)
		}
	}
	return node
}

// docNode is the object at the path of names under node, or nil.
func docNode(node map[string]any, path ...string) map[string]any {
	for _, name := range path {
		node, _ = node[name].(map[string]any)
	}
	return node
}

// docOperation is the document's operation of this id, or nil.
func docOperation(doc map[string]any, id string) map[string]any {
	_, _, op := docOperationAt(doc, id)
	return op
}

// docOperationAt is the document's operation of this id, with its method and its path (under
// the servers' base path); nil when there is none.
func docOperationAt(doc map[string]any, id string) (method, path string, op map[string]any) {
	for p, item := range docNode(doc, "paths") {
		for m, x := range item.(map[string]any) {
			if o, ok := x.(map[string]any); ok && o["operationId"] == id {
				return m, p, o
			}
		}
	}
	return "", "", nil
}

// docBasePath is the path of the document's first server: what its paths are under (/v1).
func docBasePath(doc map[string]any) string {
	servers, _ := doc["servers"].([]any)
	if len(servers) == 0 {
		return ""
	}
	first, _ := servers[0].(map[string]any)
	u, _ := url.Parse(fmt.Sprint(first["url"]))
	return strings.TrimSuffix(u.Path, "/")
}

// docParameter is an operation's own parameter of this name, or nil.
func docParameter(doc map[string]any, opID, name string) map[string]any {
	params, _ := docOperation(doc, opID)["parameters"].([]any)
	for _, p := range params {
		if q, ok := p.(map[string]any); ok && q["name"] == name {
			return q
		}
	}
	return nil
}

// docSuccess is the schema of an operation's 2xx JSON answer; an empty object for a 2xx
// without a body (a 204); nil when it has no 2xx.
func docSuccess(doc map[string]any, opID string) map[string]any {
	for status, r := range docNode(docOperation(doc, opID), "responses") {
		if !strings.HasPrefix(status, "2") {
			continue
		}
		if schema := docNode(r.(map[string]any), "content", "application/json", "schema"); schema != nil {
			return schema
		}
		description, _ := r.(map[string]any)["description"].(string)
		return map[string]any{"type": "object", "maxProperties": 0, "description": status + " " + http.StatusText(atoi(status)) + ": " + description}
	}
	return nil
}

// atoi is s as a whole number, 0 for anything else.
func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// inlined is node with every $ref replaced by what it names, and what JSON Schema does not
// read (the document's example and x- members) left out.
func inlined(doc map[string]any, node any, depth int) any {
	switch v := node.(type) {
	case map[string]any:
		out := map[string]any{}
		if ref, ok := v["$ref"].(string); ok && depth < 32 {
			path := strings.Split(strings.TrimPrefix(ref, "#/"), "/")
			for k, x := range inlined(doc, docNode(doc, path...), depth+1).(map[string]any) {
				out[k] = x
			}
		}
		for k, x := range v {
			if k != "$ref" && k != "example" && !strings.HasPrefix(k, "x-") {
				out[k] = inlined(doc, x, depth+1)
			}
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = inlined(doc, x, depth+1)
		}
		return out
	}
	return node
}

// listed is the tool as tools/list shows it to a revision: what the revision lacks left out
// (before 2025-03-26 no annotations, before 2025-06-18 no title or output schema).
func (t *mcpTool) listed(revision string) map[string]any {
	out := map[string]any{"name": t.name, "description": t.description, "inputSchema": t.input}
	if revision >= "2025-03-26" {
		out["annotations"] = map[string]any{"readOnlyHint": t.readOnly, "destructiveHint": t.destructive, "idempotentHint": t.idempotent, "openWorldHint": t.openWorld}
	}
	if revision >= "2025-06-18" {
		out["title"], out["outputSchema"] = t.title, t.output
	}
	return out
}

func (d *mcpDoor) listTools(c *mcpCall) map[string]any {
	return c.cached(map[string]any{"tools": d.listed[c.revision]})
}

// listEach writes each revision's tool list once, as tools/list answers it.
func (d *mcpDoor) listEach() error {
	d.listed = map[string]json.RawMessage{}
	for _, revision := range mcpRevisions {
		tools := make([]any, 0, len(d.tools))
		for i := range d.tools {
			tools = append(tools, d.tools[i].listed(revision))
		}
		b, err := marshalJSON(tools)
		if err != nil {
			return err
		}
		d.listed[revision] = b
	}
	return nil
}

// instructions are what the door tells an agent at the start: what the sandbox is, its base
// URL, the first call to make, and each tool of the table by its title.
func (d *mcpDoor) instructions(c *mcpCall) string {
	var tools []string
	for _, t := range d.tools {
		tools = append(tools, t.name+" ("+strings.ToLower(t.title[:1])+t.title[1:]+")")
	}
	return "The local sandbox of the Shipment Tracking and Imported Orders API (v1, developer preview), at " + c.origin + "/v1: it behaves as the real API will, " +
		"rule for rule and error for error, and never calls a carrier or a marketplace. Each tool is the API's requests, made with your key (or a key argument: a " +
		"test key of this sandbox), rate-limited and journaled as a client's. To rehearse an integration, start with create_sandbox ({\"template\":\"acct_sync\",\"idempotency_key\":\"any-new-value\"}): " +
		"an account of your own, a copy of a marketplace that moves, whose key the other tools take as key. To have an integration graded, start with start_exam (" + d.exams + "), which needs no sandbox: " +
		"its result holds the task, what it gives and the attempt's key; do the task with that key, reading at least every " + examWindow.String() + " (times the scale), answer with answer_exam, read the grade with grade_exam. The tools: " + strings.Join(tools, "; ") +
		". The resources: sandbox:///openapi.json (the document), sandbox:///README.md and every docs page."
}

// ===== mcp: a tool's call, its API requests, and its result =====

// callTool answers tools/call: the tool named (an unknown one, or arguments that are not an
// object: -32602), its arguments judged (anything wrong inside them: an error result, a
// problem as the API writes it), then its call (its API request, or the kit), and the
// result. A request cut off (the client gone) is -32603.
func (d *mcpDoor) callTool(c *mcpCall, msg *rpcMessage) (map[string]any, *mcpFault) {
	var name string
	json.Unmarshal(msg.params["name"], &name)
	t := d.tool(name)
	if t == nil {
		return nil, c.invalidParams("Invalid params: no tool " + strconv.Quote(cutField(name, 64)) + "; tools/list names them.")
	}
	args, err := toolArguments(msg.params["arguments"])
	if err != nil {
		return nil, c.invalidParams("Invalid params: the arguments of " + t.name + " are one JSON object: " + err.Error() + ".")
	}
	a := argumentProblem(t.argumentFault(args))
	if a.status == 0 {
		a = t.call(d, c, t, args)
	}
	if a.status == 0 {
		return nil, &mcpFault{c.errorStatus(http.StatusInternalServerError), rpcInternalError, "Internal error: the API request of " + t.name + " was cut off (the client went away?).", nil}
	}
	return c.toolResult(a), nil
}

// askAPI is an API tool's call: its request, made through the service in this process with
// the caller's key (or its key argument), and the API's answer; none (status 0) when the
// request was cut off.
func askAPI(d *mcpDoor, c *mcpCall, t *mcpTool, args []toolArgument) toolAnswer {
	req, fault := t.request(c, args)
	if fault != nil {
		return argumentProblem(fault)
	}
	a, _ := d.ask(req)
	return a
}

// toolAnswer is an answer a tool's call got: the API's to its request, or the door's own (a
// problem with the arguments, the kit's report and its summary line).
type toolAnswer struct {
	status int
	header http.Header
	body   []byte
	line   string // the first line of the tool's text, when it is not the headers' (the kit's summary)
}

// ask sends a tool's API request through the service, in this process, and reads its answer
// whole.
func (d *mcpDoor) ask(req *http.Request) (toolAnswer, error) {
	res, err := d.service.RoundTrip(req)
	if err != nil {
		return toolAnswer{}, err
	}
	defer res.Body.Close()
	body := make([]byte, max(res.ContentLength, 0))
	if _, err := io.ReadFull(res.Body, body); err != nil {
		return toolAnswer{}, err
	}
	return toolAnswer{status: res.StatusCode, header: res.Header, body: body}, nil
}

// invalidParams is -32602 as c's revision answers it: 400 in the stateless one, 200 else.
func (c *mcpCall) invalidParams(message string) *mcpFault {
	return &mcpFault{c.errorStatus(http.StatusBadRequest), rpcInvalidParams, message, nil}
}

// errorStatus is the HTTP status of a JSON-RPC error: its own in the stateless revision,
// 200 in a legacy one.
func (c *mcpCall) errorStatus(status int) int {
	if c.stateless {
		return status
	}
	return http.StatusOK
}

// toolArgument is one argument as sent, in the order sent.
type toolArgument struct {
	name  string
	value json.RawMessage
}

// toolArguments reads a call's arguments: absent or null is none; anything but one JSON
// object is refused.
func toolArguments(raw json.RawMessage) ([]toolArgument, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New("they are not an object")
	}
	var args []toolArgument
	for dec.More() {
		tok, _ := dec.Token()
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return nil, err
		}
		args = append(args, toolArgument{tok.(string), value})
	}
	return args, nil
}

// argumentFault is what is wrong in a call's arguments, as the API would name it, or nil: a member
// the tool does not take, one sent twice, one it needs missing, a value of the wrong type
// for where the request carries it, and the rule between members (one of the two).
func (t *mcpTool) argumentFault(args []toolArgument) *apiError {
	seen := map[string]bool{}
	for _, a := range args {
		m := t.member(a.name)
		switch {
		case m == nil:
			return paramError(codeUnknownParameter, a.name, "The tool "+t.name+" takes no argument "+strconv.Quote(cutField(a.name, 64))+"; it takes "+t.memberNames()+".")
		case seen[a.name]:
			return paramError(codeInvalidParameter, a.name, "The argument "+a.name+" is sent twice: send it once.")
		}
		seen[a.name] = true
		if why := m.valueFault(a.value); why != "" {
			return paramError(codeInvalidParameter, a.name, "The argument "+a.name+" "+why+".")
		}
	}
	for _, m := range t.members {
		if m.required && !seen[m.name] {
			return paramError(codeInvalidParameter, m.name, "The argument "+m.name+" is required.")
		}
	}
	if len(t.exactlyOne) == 2 && seen[t.exactlyOne[0]] == seen[t.exactlyOne[1]] {
		return paramError(codeInvalidParameter, t.exactlyOne[0], "Send one of "+t.exactlyOne[0]+" and "+t.exactlyOne[1]+", not both and not neither.")
	}
	return nil
}

// member is the tool's member of this name, or nil.
func (t *mcpTool) member(name string) *mcpMember {
	for i := range t.members {
		if t.members[i].name == name {
			return &t.members[i]
		}
	}
	return nil
}

// memberNames lists the tool's members, for an error's detail.
func (t *mcpTool) memberNames() string {
	names := make([]string, len(t.members))
	for i, m := range t.members {
		names[i] = m.name
	}
	return strings.Join(names, ", ")
}

// valueFault is what is wrong with a member's value for where the request carries it, ""
// when nothing is: a body member goes as sent, for the API to judge; a path, a query
// parameter or a header takes a string (a query's number as written), visible text only.
func (m *mcpMember) valueFault(v json.RawMessage) string {
	if m.in == "body" {
		return ""
	}
	var s string
	switch {
	case m.in == "query" && len(v) > 0 && (v[0] == '-' || v[0] >= '0' && v[0] <= '9'):
		return ""
	case json.Unmarshal(v, &s) != nil:
		return "is a string"
	case s == "" && m.in == "path":
		return "is empty: name one"
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return "holds a control character"
		}
	}
	return ""
}

// argumentProblem is the answer to arguments the door refuses before any request: the
// API's problem, as the API would write it; none (status 0) for no fault.
func argumentProblem(e *apiError) toolAnswer {
	if e == nil {
		return toolAnswer{}
	}
	id := newRequestID()
	h := http.Header{"Content-Type": {problemContentType}, "Request-Id": {id}}
	return toolAnswer{status: e.status(), header: h, body: appendProblem(nil, e, id)}
}

// request is the API request a tool's call makes: its path (the first of the tool's whose
// path members were sent), its query and its body in the tool's order of members, the
// Idempotency-Key, the caller's key (or the key argument), Prefer (with run), and what the
// door was reached with: its Host, its client's address, its context.
func (t *mcpTool) request(c *mcpCall, args []toolArgument) (*http.Request, *apiError) {
	given := map[string]json.RawMessage{}
	for _, a := range args {
		given[a.name] = a.value
	}
	text := func(name string) string {
		var s string
		if json.Unmarshal(given[name], &s) != nil {
			s = string(given[name]) // a query's number, as written
		}
		return s
	}
	path := t.pathFor(given, text)
	var query, prefer []string
	var body []byte
	header := http.Header{}
	key := c.key
	for _, m := range t.members {
		v, ok := given[m.name]
		switch {
		case !ok:
		case m.in == "query":
			query = append(query, url.QueryEscape(m.name)+"="+url.QueryEscape(text(m.name)))
		case m.in == "body":
			body = append(append(appendJSONString(append(body, ','), m.name), ':'), v...)
		case m.in == "header":
			header.Set(m.header, text(m.name))
		case m.in == "key":
			key = cmp.Or(text(m.name), key)
		case m.in == "prefer":
			prefer = append([]string{text(m.name)}, prefer...) // before a run tag
		case m.in == "tag":
			prefer = append(prefer, `run="`+text(m.name)+`"`)
		}
	}
	if len(query) > 0 {
		path += "?" + strings.Join(query, "&")
	}
	var reader io.Reader
	if t.method == http.MethodPost {
		if len(body) == 0 {
			body = []byte{','}
		}
		body[0] = '{'
		reader = bytes.NewReader(append(body, '}'))
	}
	req, err := http.NewRequestWithContext(c.ctx, t.method, c.origin+path, reader)
	if err != nil {
		return nil, paramError(codeInvalidParameter, t.members[0].name, "The arguments make no request: "+err.Error()+".")
	}
	req.RequestURI, req.RemoteAddr, req.Host, req.Header = path, c.remote, c.host, header
	req.Header.Set("Authorization", "Bearer "+key)
	if reader != nil {
		req.Header.Set("Content-Type", jsonContentType)
	}
	if p := strings.Join(slices.DeleteFunc(prefer, func(p string) bool { return p == "" }), ", "); p != "" {
		req.Header.Set("Prefer", p)
	}
	return req, nil
}

// pathFor is the tool's path for the members given: the first of its paths whose {member}s
// were all sent, each filled in, escaped.
func (t *mcpTool) pathFor(given map[string]json.RawMessage, text func(string) string) string {
	for _, p := range t.paths {
		filled, complete := p, true
		for _, m := range t.members {
			if m.in != "path" || !strings.Contains(p, "{"+m.name+"}") {
				continue
			}
			if _, ok := given[m.name]; !ok {
				complete = false
			}
			filled = strings.ReplaceAll(filled, "{"+m.name+"}", url.PathEscape(text(m.name)))
		}
		if complete {
			return filled
		}
	}
	return t.paths[0]
}

// The header fields the first line of a tool's text names, in its order, when present.
var toolLineFields = []string{"Retry-After", "RateLimit", "Location", "Idempotent-Replayed", "Preference-Applied", "Request-Id"}

// toolResult is an API answer as a tool's result: one text item, its first line what a
// client reads of the headers, then the body; the body as structured content (from
// 2025-06-18; {} for an answer without one); isError for a status of 400 or more; and the
// answer's status and headers in _meta["sandbox/http"].
func (c *mcpCall) toolResult(a toolAnswer) map[string]any {
	line := a.line
	if line == "" {
		line = "HTTP " + strconv.Itoa(a.status)
		for _, name := range toolLineFields {
			if v := a.header.Values(name); len(v) > 0 {
				line += " · " + name + ": " + strings.Join(v, ", ")
			}
		}
	}
	// Written by hand, as the API writes its bodies (compact): the answer's envelope takes
	// them as they are (BenchmarkMCPGetTracking: encoding/json cost a fifth of a call). The
	// text is the line, then the body: one JSON string of the two.
	content := appendJSONString(append(make([]byte, 0, len(line)+len(a.body)*9/8+64), `[{"type":"text","text":`...), line)
	if len(a.body) > 0 {
		content = append(content[:len(content)-1], `\n`...)
		open := len(content)
		content = appendJSONString(content, a.body)
		content = append(content[:open], content[open+1:]...) // the body's opening quote: the string goes on
	}
	h := append(append(append(make([]byte, 0, 512), `{"status":`...), strconv.Itoa(a.status)...), `,"request_id":`...)
	h = append(appendJSONString(h, a.header.Get("Request-Id")), `,"headers":{`...)
	for i, name := range slices.Sorted(maps.Keys(a.header)) {
		if i > 0 {
			h = append(h, ',')
		}
		h = appendJSONString(append(appendJSONString(h, name), ':'), strings.Join(a.header[name], ", "))
	}
	result := map[string]any{
		"content": json.RawMessage(append(content, "}]"...)),
		"isError": a.status >= 400,
		"_meta":   map[string]any{"sandbox/http": json.RawMessage(append(h, "}}"...))},
	}
	if c.revision >= "2025-06-18" {
		structured := json.RawMessage(a.body) // the API's body: compact JSON, an object
		if len(a.body) == 0 || a.body[0] != '{' {
			structured = json.RawMessage("{}")
		}
		result["structuredContent"] = structured
	}
	return result
}

// checkServer runs the kit for check_server: without base_url, this sandbox with the
// caller's key, in this process; a base_url on this machine (a loopback address): this
// sandbox's own origin with the caller's key, any other with the SANDBOX_CHECK_*KEY
// variables of this process's environment only. Its JSON report, or a problem when the kit
// cannot judge.
func checkServer(d *mcpDoor, c *mcpCall, t *mcpTool, args []toolArgument) toolAnswer {
	base, own := c.origin+"/v1", true
	flags := []string{"-format", "json"}
	for _, a := range args {
		var v string
		json.Unmarshal(a.value, &v)
		if a.name == "base_url" {
			base = strings.TrimSuffix(v, "/")
			if e := checkedBase(base); e != nil {
				return argumentProblem(e)
			}
			own = loopbackOriginOf(base) == loopbackOriginOf(c.origin+"/v1") || loopbackOriginOf(base) == loopbackOriginOf(d.origin+"/v1")
			continue
		}
		flags = append(flags, "-"+a.name, v)
	}
	call := kitCall{args: append(flags, "-base-url", base), getenv: func(string) string { return "" }, until: c.arrived.Add(d.writeTimeout - checkServerMargin)}
	if own {
		call.args, call.transport = append(call.args, "-key", c.key), d.service
	} else {
		call.getenv = func(name string) string {
			if strings.HasPrefix(name, "SANDBOX_CHECK_") && strings.HasSuffix(name, "KEY") {
				return d.getenv(name)
			}
			return ""
		}
	}
	ran := runKit(c.ctx, call)
	report, summary, flagAtFault, err := ran.jsonReport()
	switch param := strings.ReplaceAll(flagAtFault, "-", "_"); {
	case flagAtFault != "" && t.member(param) != nil:
		return argumentProblem(paramError(codeInvalidParameter, param, "check_server: the kit cannot run: "+err.Error()+"."))
	case flagAtFault != "" && own:
		return argumentProblem(paramError(codeInvalidParameter, "base_url", "check_server: the kit cannot run: "+err.Error()+"."))
	case flagAtFault != "":
		return argumentProblem(paramError(codeInvalidParameter, "base_url", "check_server: the kit cannot run: "+err.Error()+" (a server other than this sandbox is checked with the keys of this sandbox's environment: start the sandbox with SANDBOX_CHECK_KEY set)."))
	case err != nil:
		return argumentProblem(paramError(codeInvalidParameter, "base_url", "check_server: the kit could not judge "+base+": "+err.Error()+"."))
	}
	return toolAnswer{status: http.StatusOK, header: http.Header{"Content-Type": {jsonContentType}}, body: report, line: summary}
}

// checkServerMargin is how long before the listener's write timeout check_server stops
// judging: the kit deletes its sandboxes (4 s at most) and the answer is written within it.
const checkServerMargin = 5 * time.Second

// checkedBase refuses a base_url the door may not check: not an http URL of a loopback
// address.
func checkedBase(base string) *apiError {
	u, err := url.Parse(base)
	if err != nil || u.Scheme != "http" || u.Host == "" || !namesLoopback(strings.ToLower(u.Hostname())) {
		return paramError(codeInvalidParameter, "base_url", "check_server checks only servers on this machine: base_url is an http URL of a loopback address (127.0.0.1, localhost or [::1]), the API's base, such as http://127.0.0.1:8181/v1.")
	}
	return nil
}

// loopbackOriginOf is a base URL's origin as this door compares them: scheme and host,
// lower-cased, localhost as 127.0.0.1.
func loopbackOriginOf(base string) string {
	return strings.Replace(strings.ToLower(originOfBase(base)), "://localhost:", "://127.0.0.1:", 1)
}

// ===== mcp: the resources =====

// mcpResource is a resource of the door: the document (served as GET /v1/openapi.json
// serves it, its servers at the origin the request named), the README or a docs page.
type mcpResource struct {
	uri, name, title, mimeType string
	text                       []byte // nil: the document, written for each request's origin
}

// mcpResources are the door's resources: the document, the README, every docs page.
func mcpResources() ([]mcpResource, error) {
	list := []mcpResource{{uri: "sandbox:///openapi.json", name: "openapi.json", title: "The API's OpenAPI 3.1 document", mimeType: jsonContentType}}
	pages, err := fs.Glob(embeddedPages, "docs/*.md")
	if err != nil {
		return nil, err
	}
	for _, name := range append([]string{"README.md"}, pages...) {
		text, err := embeddedPages.ReadFile(name)
		if err != nil {
			return nil, err
		}
		heading, _, _ := strings.Cut(string(text), "\n")
		list = append(list, mcpResource{uri: "sandbox:///" + name, name: name, title: strings.TrimPrefix(heading, "# "), mimeType: "text/markdown", text: text})
	}
	return list, nil
}

// textFor is what reading the resource gives a request named by origin.
func (r *mcpResource) textFor(d *mcpDoor, origin string) []byte {
	if r.text != nil {
		return r.text
	}
	return d.document(origin)
}

func (d *mcpDoor) listResources(c *mcpCall) map[string]any {
	list := make([]any, 0, len(d.resources))
	for i := range d.resources {
		r := &d.resources[i]
		size := len(r.text)
		if r.text == nil { // the document, as textFor writes it
			size = d.documentSize(c.origin)
		}
		item := map[string]any{"uri": r.uri, "name": r.name, "mimeType": r.mimeType, "size": size}
		if c.revision >= "2025-06-18" {
			item["title"] = r.title
		}
		list = append(list, item)
	}
	return c.cached(map[string]any{"resources": list})
}

// readResource answers resources/read: the resource's text; a URI the door does not serve
// is -32002 in a legacy revision, -32602 in the stateless one.
func (d *mcpDoor) readResource(c *mcpCall, msg *rpcMessage) (map[string]any, *mcpFault) {
	var uri string
	json.Unmarshal(msg.params["uri"], &uri)
	for i := range d.resources {
		if r := &d.resources[i]; r.uri == uri {
			return c.cached(map[string]any{"contents": []any{map[string]any{"uri": r.uri, "mimeType": r.mimeType, "text": string(r.textFor(d, c.origin))}}}), nil
		}
	}
	message := "Resource not found: " + strconv.Quote(cutField(uri, 128)) + "; resources/list names the resources."
	if c.stateless {
		return nil, c.invalidParams(message)
	}
	return nil, &mcpFault{http.StatusOK, rpcResourceNotFound, message, map[string]any{"uri": uri}}
}

// ===== mcp: stdio and the bridge, the transports over the door =====

// runMCP is go run . mcp: newline-delimited JSON-RPC on stdin and stdout, carried to a
// door that open makes ready (main hands it the serve book's openBridgeTarget): this
// sandbox, started as go run . starts it but on a free loopback port by default, its start
// lines and logs on stderr, reached in this process; or, with -base-url, the /mcp of a
// sandbox that runs already. Its requests act as -mcp-key (default sk_test_sandbox_all),
// checked once at start: refused, exit 2. End of input: the requests in flight answered, the
// sandbox drained, exit 0.
func runMCP(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, open bridgeOpener) int {
	lines := newConsole(stderr) // never waits on a stderr that stopped reading
	status := carryStdio(ctx, args, stdin, stdout, stderr, open, func(s string) { lines.say("sandbox mcp: " + s + "\n") })
	lines.close(time.Now().Add(finalLineWait))
	return status
}

// bridgeOpener reads go run . mcp's flags and makes its door ready: -h written to usage
// (flag.ErrHelp), a flag refused (a *usageError), or a sandbox that would not start.
type bridgeOpener func(ctx context.Context, args []string, usage io.Writer) (bridgeTarget, error)

// bridgeTarget is the door a stdio session carries its messages to: the sandbox's base URL and
// the transport that reaches it (this process's server, whose door the bridge trusts, or
// the network to another's), the key its requests act as and what the user set it with, how
// long the way out gives the answers in flight, and what stops the sandbox it started.
type bridgeTarget struct {
	base         string
	rt           http.RoundTripper
	inside       bool
	key, keyName string
	drain        time.Duration
	stop         func() error
}

// carryStdio is runMCP but its lines on stderr. The way out, at the end of input, a signal,
// or a stdout that is closed: the sandbox it started drains as on SIGTERM, and the answers in
// flight get as long as a drain (10 s, the drain timeout) to be written, both from the end;
// a request still waiting for its sandbox then is answered -32603. Exit 0 when every request
// was answered, 1 when an answer could not be written (stdout stalled or closed) or the
// sandbox did not stop cleanly.
func carryStdio(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, open bridgeOpener, say func(string)) int {
	session, err := open(ctx, args, stderr)
	var usage *usageError
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &usage):
		say(err.Error())
		return 2
	case err != nil:
		say(err.Error())
		return 1
	}
	b := newMCPBridge(session.base, session.rt, session.inside, session.key, stdout, say)
	if why := b.checkKey(ctx); why != "" {
		say(session.keyName + ": " + why)
		session.stop()
		return 2
	}
	answered := b.carryAll(ctx, stdin)
	stopped := make(chan error, 1)
	go func() { stopped <- session.stop() }()
	waiting, lost := answered(time.Now().Add(session.drain))
	err = <-stopped
	if waiting > 0 {
		say(fmt.Sprintf("%d requests were still waiting for the sandbox at %s when the session ended: each was answered -32603", waiting, session.base))
	}
	switch {
	case lost > 0:
		say(fmt.Sprintf("%d answers were not written: standard output stopped reading, or was closed", lost))
		return 1
	case err != nil:
		say(err.Error())
		return 1
	}
	return 0
}

// defaultMCPKey is the key a stdio session acts as by default: the default dataset's key
// of both scopes.
const defaultMCPKey = "sk_test_sandbox_all"

// The bridge's bounds: each exchange with a sandbox, its answer's body included, takes at
// most bridgeExchange; an answer is at most maxBridgeAnswer; the answers held at once, at
// most bridgeHeld; at most maxInFlight messages are carried at once.
const (
	bridgeExchange  = 60 * time.Second
	maxBridgeAnswer = 4 << 20
	bridgeHeld      = 64 << 20
	maxInFlight     = 64
)

// mcpBridge carries messages between stdin and stdout and a door: each line a POST to its
// /mcp, with the headers an HTTP client of the door sends (the key, the revision the
// handshake settled or the request's _meta names, Mcp-Method and Mcp-Name). The door of this
// process is trusted; another's (-base-url) is not: what it answers is written only when it
// is one JSON-RPC response to the request, and then re-encoded.
type mcpBridge struct {
	base     string            // the API's base URL: the door is at its origin's /mcp
	rt       http.RoundTripper // the sandbox, in this process, or the network
	inside   bool              // rt is this process's server
	exchange time.Duration     // the most one exchange with the sandbox takes, its answer's body included
	key      string
	revision atomic.Pointer[string] // the legacy revision initialize settled
	held     *byteBudget            // the answers another door's sandbox sends, held at once
	out      io.Writer
	outMu    sync.Mutex    // one line at a time on stdout
	pending  atomic.Int64  // messages carried whose answer is not written yet
	asking   atomic.Int64  // of them, those waiting for the sandbox's answer
	lost     atomic.Int64  // answers stdout refused
	closed   chan struct{} // closed when stdout refuses a write: nothing more can be answered
	once     sync.Once
	say      func(string) // a line on stderr, masked and escaped
	secrets  *secrets     // its key, which nothing it writes holds
}

// newMCPBridge is a bridge to the door of the sandbox at base, reached through rt (this
// process's server when inside), acting as key; what it says on stderr (say) holds no key
// and no control character.
func newMCPBridge(base string, rt http.RoundTripper, inside bool, key string, out io.Writer, say func(string)) *mcpBridge {
	secrets := newSecrets(map[string]string{"SANDBOX_MCP_KEY": key})
	return &mcpBridge{base: base, rt: rt, inside: inside, exchange: bridgeExchange, key: key, out: out, closed: make(chan struct{}), held: newByteBudget(bridgeHeld),
		secrets: secrets, say: func(s string) { say(printable(secrets.mask(s))) }}
}

// checkKey asks the sandbox whether it takes the bridge's key, within an exchange's time: ""
// when it answers 200 whole, else what it answered (a refused key, a base URL without /v1,
// no answer).
func (b *mcpBridge) checkKey(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, b.exchange)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, b.base+"/test_helpers/clock", nil)
	req.Header.Set("Authorization", "Bearer "+b.key)
	res, err := b.rt.RoundTrip(req)
	if err != nil {
		return "the sandbox at " + b.base + " cannot be reached: " + err.Error()
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, 64<<10))
	switch {
	case err != nil:
		return fmt.Sprintf("the sandbox at %s answered %d, but its body did not arrive whole (%v)", b.base, res.StatusCode, err)
	case res.StatusCode == http.StatusOK:
		return ""
	}
	var p struct{ Code, Detail string }
	json.Unmarshal(body, &p)
	why := fmt.Sprintf("the sandbox at %s answered %d %s to GET %s/test_helpers/clock with the key", b.base, res.StatusCode, cmp.Or(p.Code, http.StatusText(res.StatusCode)), b.base)
	switch {
	case res.StatusCode == http.StatusUnauthorized || res.StatusCode == http.StatusForbidden || res.StatusCode == http.StatusServiceUnavailable:
		why += ": it refused the key (" + cutField(p.Detail, 256) + ")"
	case res.StatusCode == http.StatusNotFound && !strings.HasSuffix(b.base, "/v1"):
		why += ": is /v1 missing? -base-url is the API's base, such as http://127.0.0.1:8080/v1"
	default:
		why += ": it is not a sandbox that takes the key, or not the API's base"
	}
	return why
}

// carryAll carries each line of stdin, up to maxInFlight at once, until its end, a signal, or
// a stdout that is closed, and returns what waits for the answers in flight until a deadline:
// at the deadline a request still waiting for its sandbox is answered -32603, and it says how
// many were, and how many answers stdout did not take. An initialize is carried before the
// next line: what it settles, the next requests send. A request in flight at a signal is
// answered, as a drain answers it.
func (b *mcpBridge) carryAll(ctx context.Context, stdin io.Reader) (answered func(deadline time.Time) (waiting, lost int64)) {
	lines := readLines(ctx, stdin)
	carrying, cutOff := context.WithCancel(context.WithoutCancel(ctx))
	var inFlight sync.WaitGroup
	slots := make(chan struct{}, maxInFlight)
	answered = func(deadline time.Time) (int64, int64) {
		done := make(chan struct{})
		go func() { inFlight.Wait(); close(done) }()
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		waiting := int64(0)
		select {
		case <-done:
		case <-t.C:
			waiting = b.asking.Load()
			cutOff() // each carry still waiting answers -32603 at once
			select {
			case <-done:
			case <-time.After(finalLineWait):
			}
		}
		return waiting, b.pending.Load() + b.lost.Load()
	}
	for {
		var line stdinLine
		var ok bool
		select {
		case line, ok = <-lines:
		case <-ctx.Done():
		case <-b.closed:
		}
		if !ok {
			return answered
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return answered
		case <-b.closed:
			return answered
		}
		b.pending.Add(1)
		inFlight.Add(1)
		done := make(chan struct{})
		go func() {
			defer func() { b.pending.Add(-1); <-slots; inFlight.Done(); close(done) }()
			b.carry(carrying, line)
		}()
		if bytes.Contains(line.text[:min(len(line.text), 256)], []byte(`"initialize"`)) {
			select {
			case <-done:
			case <-ctx.Done():
			case <-b.closed:
			}
		}
	}
}

// stdinLine is a line of stdin: at most the body cap and one byte of it, and, for a line
// over the cap, the id it names wherever it stands (nil: none found).
type stdinLine struct {
	text []byte
	over bool
	id   json.RawMessage
}

// readLines sends each line of stdin that holds anything, until its end or a signal.
func readLines(ctx context.Context, stdin io.Reader) <-chan stdinLine {
	lines := make(chan stdinLine)
	go func() {
		defer close(lines)
		r := bufio.NewReaderSize(stdin, 64<<10)
		for {
			line, err := readMessageLine(r)
			if len(bytes.TrimSpace(line.text)) > 0 || line.over {
				select {
				case lines <- line:
				case <-ctx.Done():
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	return lines
}

// readMessageLine reads one line of stdin, without its end of line: at most one byte past
// the body cap is kept; what is past it is read and dropped, its top-level id found on the
// way (the official TypeScript SDK writes id last), so that the line is answered for it.
func readMessageLine(r *bufio.Reader) (stdinLine, error) {
	var line stdinLine
	var ids idFinder
	for {
		chunk, err := r.ReadSlice('\n')
		if room := maxBodyBytes + 1 - len(line.text); room > 0 {
			line.text = append(line.text, chunk[:min(len(chunk), room)]...)
		}
		ids.feed(chunk)
		if err != bufio.ErrBufferFull {
			line.text = bytes.TrimRight(line.text, "\r\n")
			if line.over = len(line.text) > maxBodyBytes; line.over {
				line.id = ids.id
			}
			return line, err
		}
	}
}

// idFinder finds the id member of a JSON object, read a chunk at a time, wherever it stands
// among the object's members: a string or a number of at most maxFoundID bytes (the last
// given, as the door reads one given twice), or none.
type idFinder struct {
	depth             int
	inString, escaped bool
	atName            bool   // at the object's top, the next string is a member's name
	reading           uint8  // what token holds: idNothing, idName or idValue
	token             []byte // the name, or the id's value, as read so far
	named             string // the last member's name read at the object's top
	id                json.RawMessage
}

const (
	idNothing uint8 = iota
	idName
	idValue
	maxFoundID = 1024
)

func (f *idFinder) feed(p []byte) {
	for _, c := range p {
		f.step(c)
	}
}

func (f *idFinder) step(c byte) {
	if f.inString {
		f.stepInString(c)
		return
	}
	switch {
	case c == '"' && f.depth == 1 && f.atName:
		f.inString, f.reading, f.token = true, idName, append(f.token[:0], c)
	case c == '"':
		f.inString = true
		f.keep(c)
	case c == '{' || c == '[':
		f.open(c)
	case c == ':' && f.depth == 1:
		f.atName = false
		if f.named == "id" {
			f.reading, f.token = idValue, f.token[:0]
		}
	case (c == ',' || c == '}' || c == ']') && f.depth == 1:
		f.settle()
		f.atName = c == ','
		if c != ',' {
			f.depth--
		}
	case c == '}' || c == ']':
		f.depth--
	default:
		f.keep(c)
	}
}

// open reads an object's or a list's start: one level deeper, and no id when it is a value.
func (f *idFinder) open(c byte) {
	f.depth++
	f.atName = f.depth == 1 && c == '{'
	if f.depth > 1 && f.reading == idValue { // an object or a list is no id
		f.reading = idNothing
	}
}

// stepInString reads c within a string: its end, unless escaped, ends a member's name.
func (f *idFinder) stepInString(c byte) {
	f.keep(c)
	switch {
	case f.escaped:
		f.escaped = false
	case c == '\\':
		f.escaped = true
	case c == '"':
		f.inString = false
		if f.reading == idName {
			json.Unmarshal(f.token, &f.named)
			f.reading = idNothing
		}
	}
}

// keep adds c to the token being read; a token past maxFoundID is no id.
func (f *idFinder) keep(c byte) {
	if f.reading == idNothing {
		return
	}
	if len(f.token) == maxFoundID {
		f.reading = idNothing
		return
	}
	f.token = append(f.token, c)
}

// settle ends a member's value at the object's top: the id's, when it is a string or a number.
func (f *idFinder) settle() {
	if f.reading == idValue {
		if v := bytes.TrimSpace(f.token); validID(v) && json.Valid(v) && utf8.Valid(v) {
			f.id = bytes.Clone(v)
		}
	}
	f.reading, f.named = idNothing, ""
}

// carry carries one message to the door and writes its answer to stdout: this process's
// door's JSON-RPC answer as it is; another's once it is read as one response to the request;
// for a request the door could not be reached with or did not answer (the sandbox gone, a
// refused key, a 5xx, a line over the cap, an answer that is not one), a JSON-RPC error of
// its own for its id.
func (b *mcpBridge) carry(ctx context.Context, line stdinLine) {
	// What the bridge needs of the line: a stateless request's headers, an initialize's
	// revision, the id to answer for (another door's answer is held to it); the door reads it whole.
	var head mcpHead
	switch {
	case line.over:
		head = mcpHead{read: true, id: line.id}
		b.undeliverable(head, "a line over 256 KiB with no id that could be read", fmt.Sprintf("the message is over %d bytes (256 KiB), the most the sandbox takes", maxBodyBytes))
		return
	case !utf8.Valid(line.text):
		b.writeLine(rpcError(nil, rpcParseError, "Parse error: the message is not UTF-8, as JSON must be.", nil))
		return
	case !b.inside || bytes.Contains(line.text, []byte(`"_meta"`)) || bytes.Contains(line.text, []byte(`"initialize"`)):
		head = messageHead(line.text)
	}
	fail := func(why string) {
		if !head.read {
			head = messageHead(line.text)
		}
		b.undeliverable(head, "", why)
	}
	ctx, cancel := context.WithTimeout(ctx, b.exchange)
	defer cancel()
	b.asking.Add(1)
	res, err := b.rt.RoundTrip(b.request(ctx, line.text, head))
	if err != nil {
		b.asking.Add(-1)
		fail("the sandbox at " + b.base + " " + b.unreachable(ctx, err))
		return
	}
	defer res.Body.Close()
	answer, why, held := b.lineOf(ctx, res, head)
	defer b.held.give(held) // once its line is written: every copy of it counted until then
	b.asking.Add(-1)
	switch {
	case why != "":
		fail(why)
	case answer == nil: // a notification taken
	default:
		if head.method == "initialize" {
			var settled struct {
				Result struct{ ProtocolVersion string } `json:"result"`
			}
			if json.Unmarshal(answer, &settled) == nil && settled.Result.ProtocolVersion != "" {
				b.revision.Store(&settled.Result.ProtocolVersion)
			}
		}
		b.writeLine(answer)
	}
}

// unreachable says why a sandbox's exchange failed: no answer in time, the session ended, or
// the network's error.
func (b *mcpBridge) unreachable(ctx context.Context, err error) string {
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return fmt.Sprintf("did not answer within %v", b.exchange)
	case ctx.Err() != nil:
		return "had not answered when the session ended"
	}
	return "cannot be reached: " + err.Error()
}

// request is the POST of line to the door, with the headers its client sends.
func (b *mcpBridge) request(ctx context.Context, line []byte, head mcpHead) *http.Request {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, originOfBase(b.base)+"/mcp", bytes.NewReader(line))
	if b.inside {
		req.RequestURI, req.RemoteAddr = "/mcp", "127.0.0.1:0"
	}
	req.Header.Set("Content-Type", jsonContentType)
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+b.key)
	if head.revision != "" {
		req.Header.Set("MCP-Protocol-Version", head.revision)
		req.Header.Set("Mcp-Method", head.method)
		if head.mirrored {
			req.Header.Set("Mcp-Name", encodeMcpName(head.name))
		}
	} else if r := b.revision.Load(); r != nil {
		req.Header.Set("MCP-Protocol-Version", *r)
	}
	return req
}

// lineOf reads a door's answer to the message head: the line to write (nil for a
// notification taken), or why it is not one. This process's door's JSON-RPC answer is
// written as it is; another's is read, within the bridge's bounds (its time, its size, the
// bytes held at once), and written only when it is one JSON-RPC response to the request,
// re-encoded compactly.
func (b *mcpBridge) lineOf(ctx context.Context, res *http.Response, head mcpHead) ([]byte, string, int64) {
	rpc := res.Header.Get("Content-Type") == jsonContentType
	if b.inside {
		body, err := io.ReadAll(res.Body)
		switch {
		case err == nil && res.StatusCode == http.StatusAccepted:
			return nil, "", 0
		case err == nil && rpc:
			return body, "", 0
		}
		return nil, problemOf(res, body), 0
	}
	size := int64(maxBridgeAnswer + 1)
	if res.ContentLength >= 0 {
		size = min(size, res.ContentLength)
	}
	held := size * bridgeCopies
	if !b.held.take(ctx, held) {
		return nil, "the session ended while the bridge's memory was full", 0
	}
	line, why := b.readAnswer(ctx, res, head, size)
	return line, why, held
}

// bridgeCopies is how many copies of an answer the bridge holds at its peak, each counted
// against bridgeHeld: the body read, its members decoded, their compact encoding, the line
// (grown by appending) and the line as written.
const bridgeCopies = 6

// readAnswer reads another door's answer of at most size bytes and judges it.
func (b *mcpBridge) readAnswer(ctx context.Context, res *http.Response, head mcpHead, size int64) ([]byte, string) {
	rpc := res.Header.Get("Content-Type") == jsonContentType
	defer context.AfterFunc(ctx, func() { res.Body.Close() })() // a body that stalls is cut at the exchange's end, whatever its transport
	body, err := io.ReadAll(io.LimitReader(res.Body, size))
	switch {
	case err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		return nil, fmt.Sprintf("the sandbox answered %d, but its body did not arrive within %v", res.StatusCode, b.exchange)
	case err != nil && ctx.Err() != nil:
		return nil, fmt.Sprintf("the sandbox answered %d, but its body had not arrived when the session ended", res.StatusCode)
	case err != nil:
		return nil, fmt.Sprintf("the sandbox answered %d, but its body could not be read: %v", res.StatusCode, err)
	case len(body) > maxBridgeAnswer || res.ContentLength > maxBridgeAnswer:
		return nil, fmt.Sprintf("the sandbox answered over %d bytes (4 MiB), the most the bridge takes", maxBridgeAnswer)
	case res.StatusCode == http.StatusAccepted && head.id == nil:
		return nil, ""
	case res.StatusCode == http.StatusAccepted:
		return nil, "the sandbox answered 202 Accepted, with no answer to the request"
	case !utf8.Valid(body):
		return nil, fmt.Sprintf("the sandbox answered %d with a body that is not UTF-8", res.StatusCode)
	case !rpc:
		return nil, problemOf(res, body)
	}
	return reencoded(body, head.id)
}

// problemOf says what a door answered instead of a JSON-RPC answer: its status, and its
// problem's code and detail when it wrote one.
func problemOf(res *http.Response, body []byte) string {
	var p struct{ Code, Detail string }
	json.Unmarshal(body, &p)
	return strings.TrimSpace(fmt.Sprintf("the sandbox answered %d %s", res.StatusCode, p.Code)) + ": " + cmp.Or(p.Detail, http.StatusText(res.StatusCode))
}

// reencoded is another door's answer, body, as one compact line, when it is one JSON-RPC
// response to the request of id: "jsonrpc":"2.0", that id (null with an error: the door
// could not read the request), exactly one of result and error; else why it is not.
func reencoded(body []byte, id json.RawMessage) ([]byte, string) {
	var answer map[string]json.RawMessage
	if err := json.Unmarshal(body, &answer); err != nil {
		return nil, "the sandbox answered something that is not one JSON-RPC response: " + err.Error()
	}
	result, hasResult := answer["result"]
	failure, hasError := answer["error"]
	got, hasID := answer["id"]
	switch {
	case string(answer["jsonrpc"]) != `"2.0"`:
		return nil, `the sandbox answered something that is not one JSON-RPC response: no "jsonrpc":"2.0"`
	case hasResult == hasError:
		return nil, "the sandbox answered a JSON-RPC message with neither or both of result and error"
	case !hasID || !sameID(got, id) && !(hasError && string(got) == "null"):
		return nil, "the sandbox answered for another id (" + cutField(string(got), 64) + "), not this request's"
	}
	member, value := "result", result
	if hasError {
		member, value = "error", failure
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, value); err != nil {
		return nil, "the sandbox's " + member + " is not JSON: " + err.Error()
	}
	line := append(append([]byte(`{"jsonrpc":"2.0","id":`), got...), `,"`+member+`":`...)
	return append(append(line, compact.Bytes()...), '}'), ""
}

// sameID reports whether two JSON-RPC ids are one: equal strings, or equal numbers.
func sameID(a, b json.RawMessage) bool {
	if bytes.Equal(a, b) {
		return true
	}
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	if xs, ok := x.(string); ok {
		ys, ok := y.(string)
		return ok && xs == ys
	}
	xr, okx := new(big.Rat).SetString(strings.TrimSpace(string(a)))
	yr, oky := new(big.Rat).SetString(strings.TrimSpace(string(b)))
	return okx && oky && xr.Cmp(yr) == 0
}

// undeliverable answers a request the bridge could not deliver, or whose answer it could not
// take, with a JSON-RPC error for its id; a notification's (no id) is only said on stderr.
// What it says holds no key, and only valid UTF-8.
func (b *mcpBridge) undeliverable(head mcpHead, what, why string) {
	if head.id == nil {
		b.say(cmp.Or(what, "a notification ("+cutField(head.method, 64)+")") + " was not delivered: " + why)
		return
	}
	message := b.secrets.mask(strings.ToValidUTF8(cutField(why, 1024), "\ufffd"))
	b.writeLine(rpcError(head.id, rpcInternalError, "Internal error: "+message+".", nil))
}

// writeLine writes one answer, a line, to stdout; one that stdout refuses is lost, and ends the
// session (go run . mcp ignores SIGPIPE, so a closed stdout is an error here).
func (b *mcpBridge) writeLine(answer []byte) {
	b.outMu.Lock()
	defer b.outMu.Unlock()
	if _, err := b.out.Write(append(bytes.TrimSpace(answer), '\n')); err != nil {
		b.lost.Add(1)
		b.once.Do(func() {
			b.say("standard output refused an answer (" + err.Error() + "): the session ends")
			close(b.closed)
		})
	}
}

// byteBudget bounds the bytes held at once: take waits until n more fit, give returns them.
// Takers wait their turn one at a time, so that none holds part of what it needs while
// another waits for the rest.
type byteBudget struct {
	turn      sync.Mutex
	mu        sync.Mutex
	room, all int64
	freed     chan struct{} // signalled when bytes are given back
}

func newByteBudget(n int64) *byteBudget {
	return &byteBudget{room: n, all: n, freed: make(chan struct{}, 1)}
}

// take holds n bytes once they fit (n past the whole budget waits for all of it), or reports
// false when ctx ends first.
func (bb *byteBudget) take(ctx context.Context, n int64) bool {
	bb.turn.Lock()
	defer bb.turn.Unlock()
	for {
		bb.mu.Lock()
		if bb.room >= n || bb.room == bb.all {
			bb.room -= n
			bb.mu.Unlock()
			return true
		}
		bb.mu.Unlock()
		select {
		case <-bb.freed:
		case <-ctx.Done():
			return false
		}
	}
}

func (bb *byteBudget) give(n int64) {
	bb.mu.Lock()
	bb.room += n
	bb.mu.Unlock()
	select {
	case bb.freed <- struct{}{}:
	default:
	}
}

// mcpHead is what the bridge reads of a line: its id and method, and what it sends in the
// headers of a stateless request: the revision its _meta names, the name Mcp-Name mirrors.
type mcpHead struct {
	read     bool
	id       json.RawMessage // nil: none (a notification), or none readable
	method   string
	revision string
	name     string
	mirrored bool
}

// messageHead reads a line's id, method, and the stateless revision's headers: what Mcp-Name
// mirrors is the door's mcpName, the one writer of that rule.
func messageHead(line []byte) mcpHead {
	msg, refused := readRPC(line)
	if refused != nil || msg == nil {
		return mcpHead{read: true}
	}
	head := mcpHead{read: true, id: msg.id, method: msg.method}
	var meta map[string]json.RawMessage
	json.Unmarshal(msg.params["_meta"], &meta)
	json.Unmarshal(meta[metaRevision], &head.revision)
	head.name, head.mirrored = mcpName(msg)
	return head
}

// ===== check: its command and its flags =====

// The conformance kit (go run . check) judges any server that claims the API by the spec's
// rules, each a named rule made over HTTP as any client would make it: the live API on the
// day it opens, a partner's implementation, another build of this sandbox, or, without
// -base-url, this one, started in this process. It is a client of the API, not a part of the
// server: it reads every answer with eyes of its own (a JSON reader and types of its own) and
// shares with the server only the contract's words (paths, codes, vocabularies, limits), so
// that a server that renames a member fails every rule that reads it. Where the server makes
// sandboxes it judges what it sees against what it sent. It carries keys to a server it does
// not trust: it follows no redirect, sends keys to the base URL's host only, reads at most
// 1 MiB of an answer and 64 KiB of its headers, bounds each request and each wait by
// -timeout, and masks every key in everything it writes. Its parts, in the order a run meets
// them: this command and its flags; its requests and what it keeps of their answers; its
// world; the catalogue, each rule's judge under its prefix; the reports; check diff.

// Exit statuses of the kit.
const (
	checkPassed      = 0   // no MUST rule failed (but as expected), no expectation stale
	checkFailed      = 1   // a MUST rule failed, or an expectation is stale (with -strict, any rule failed)
	checkCannotJudge = 2   // a usage error, or a server the kit could not judge
	checkInterrupted = 130 // SIGINT or SIGTERM: its sandboxes deleted
)

// kitRole is what a key is for in a run: the variable a report's curl names it by.
type kitRole string

const (
	roleNone     kitRole = ""
	roleMain     kitRole = "KEY"
	roleAlt      kitRole = "ALT_KEY"
	roleTracking kitRole = "TRACKING_KEY"
	roleOrders   kitRole = "ORDERS_KEY"
	roleExpired  kitRole = "EXPIRED_KEY"
	roleRevoked  kitRole = "REVOKED_KEY"
	roleBurst    kitRole = "BURST_KEY"
)

// kitRoles is the one table of the kit's keys: the flag that gives one (the burst's has
// none: only the kit's own world makes it), what -h and a rule that misses it say, and the
// key the kit's own world asks its main sandbox for, in this order (none for ALT_KEY: the
// other sandbox's key).
var kitRoles = []struct {
	role        kitRole
	flag, usage string
	asked       string
}{
	{roleMain, "key", "a test `key` with both scopes (required with -base-url)", `{"scopes":["tracking:read","orders:read"]}`},
	{roleAlt, "alt-key", "a test `key` of another account, both scopes", ""},
	{roleTracking, "tracking-key", "a test `key` with tracking:read only", `{"scopes":["tracking:read"]}`},
	{roleOrders, "orders-key", "a test `key` with orders:read only", `{"scopes":["orders:read"]}`},
	{roleExpired, "expired-key", "an expired test `key`", `{"scopes":["tracking:read","orders:read"],"expires_at":"2000-01-01T00:00:00Z"}`},
	{roleRevoked, "revoked-key", "a revoked test `key`", `{"scopes":["tracking:read","orders:read"],"revoked":true}`},
	{roleBurst, "", "", `{"scopes":["tracking:read","orders:read"]}`},
}

// flagOf is the flag that gives role's key, for a rule that needs it.
func flagOf(role kitRole) string {
	for _, r := range kitRoles {
		if r.role == role {
			return "-" + r.flag
		}
	}
	return ""
}

// checkConfig is what check is told, by flags and SANDBOX_CHECK_<NAME>.
type checkConfig struct {
	baseURL    string // "": the self-check
	keys       map[kitRole]string
	profile    string
	full       bool
	rules      []string          // ids or prefixes ending in *; nil: every rule
	expect     map[string]string // rule id or prefix: the reason it is expected to fail
	expectFile string
	format     string
	out        string
	timeout    time.Duration
	strict     bool
}

// kitUsageError is a usage error of the kit, naming its flag ("" when it names none, as an
// unknown flag or an argument): the door's check_server names the argument at fault by it.
type kitUsageError struct {
	flag string
	err  error
}

func (e *kitUsageError) Error() string { return e.err.Error() }

// parseCheckConfig reads check's flags, each judged as it is read, then SANDBOX_CHECK_<NAME>
// for each not given (a fault names the flag or the variable), then what holds between them.
func parseCheckConfig(args []string, getenv func(string) string, usage io.Writer) (checkConfig, error) {
	cfg := checkConfig{keys: map[kitRole]string{}, profile: "sandbox", format: "text", timeout: 10 * time.Second}
	mode, fault := "", ""
	fs := flag.NewFlagSet("sandbox check", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	judged := func(name, usage string, parse func(string) error) { // each flag's fault names it
		fs.Func(name, usage, func(v string) error {
			err := parse(v)
			if err != nil {
				fault = name
			}
			return err
		})
	}
	judged("base-url", "the server under check: the API's base, an absolute http or https `URL` such as http://127.0.0.1:8080/v1 (default: this sandbox, started in this process)", func(v string) (err error) {
		cfg.baseURL, err = apiBaseURL(v)
		return err
	})
	for _, r := range kitRoles {
		if r.flag != "" {
			fs.Func(r.flag, r.usage, func(v string) error { cfg.keys[r.role] = v; return nil }) // judged below: a refused value is never echoed
		}
	}
	judged("profile", "the spec's stated difference to expect: `sandbox` (default) or domain_adapter", oneOfFlag(&cfg.profile, "sandbox", "domain_adapter"))
	judged("rules", "comma-separated rule `ids`, or prefixes ending in * such as tracking.* (default: every rule)", func(v string) (err error) {
		cfg.rules, err = ruleNames(strings.Split(v, ","))
		return err
	})
	judged("mode", "`safe`, or full to add the rules that load the server (default safe; full for the self-check)", oneOfFlag(&mode, "safe", "full"))
	judged("expect", "a JSON `file` of known differences, rule id (or prefix ending in *) to reason: such a rule that fails is expected, one that passes is stale", func(v string) (err error) {
		cfg.expectFile = v
		cfg.expect, err = readExpectations(v)
		return err
	})
	judged("format", "the report's `format`: text (default), json or junit", oneOfFlag(&cfg.format, "text", "json", "junit"))
	fs.StringVar(&cfg.out, "out", "", "write the report to this `file` (default: standard output)")
	judged("timeout", "the longest one request, or one wait, may take, as a Go `duration` (default 10s)", func(v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return errors.New("want a positive Go duration such as 10s")
		}
		cfg.timeout = d
		return nil
	})
	fs.BoolVar(&cfg.strict, "strict", false, "a failed SHOULD rule fails the run too")
	given, err := parseFlags(fs, args, usage, "Usage: sandbox check [flags]: the spec's rules, checked over HTTP against a server (without -base-url, this sandbox), or sandbox check diff OLD.json NEW.json. Each flag falls back to SANDBOX_CHECK_<NAME> (e.g. SANDBOX_CHECK_KEY). Exit status: 0 no MUST rule failed, 1 one did or an expectation is stale, 2 the kit could not judge, 130 interrupted.", "check", "check -h")
	if err == nil {
		err = fallBack(fs, given, getenv, "SANDBOX_CHECK_")
	}
	if err == nil {
		err = cfg.settle(mode, given)
	}
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		var named *kitUsageError
		if !errors.As(err, &named) {
			err = &kitUsageError{fault, err}
		}
	}
	return cfg, err
}

// settle judges what holds between check's flags once each is read: the keys, the mode.
func (cfg *checkConfig) settle(mode string, given map[string]bool) error {
	cfg.full = mode == "full" || mode == "" && cfg.baseURL == ""
	if err := keysFault(cfg.keys, given); err != nil {
		return err
	}
	switch {
	case cfg.baseURL != "" && cfg.keys[roleMain] == "":
		return &kitUsageError{"key", errors.New("-key: a test key with both scopes is required with -base-url (or SANDBOX_CHECK_KEY)")}
	case cfg.baseURL == "" && cfg.keys[roleMain] == "":
		cfg.keys[roleMain] = "sk_test_sandbox_all"
	}
	return nil
}

// oneOfFlag is a flag's parser of one of values.
func oneOfFlag(dst *string, values ...string) func(string) error {
	return func(v string) error {
		if !slices.Contains(values, v) {
			return fmt.Errorf("want %s", strings.Join(values, " or "))
		}
		*dst = v
		return nil
	}
}

// kitKeyFault is why key cannot be carried: it must be sendable as a Bearer credential (RFC
// 6750's token68) and long enough to be masked.
func kitKeyFault(key string) error {
	body := strings.TrimRight(key, "=")
	if body == "" || strings.Trim(body, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/") != "" {
		return errors.New("not sendable as a Bearer credential: letters, digits and - . _ ~ + / (then = padding only)")
	}
	if len(key) < minMaskedKey {
		return fmt.Errorf("shorter than %d characters: the kit masks every key in what it writes, and cannot mask a shorter one", minMaskedKey)
	}
	return nil
}

// keysFault is why a key given cannot be carried, naming its flag or its variable, never
// the key.
func keysFault(keys map[kitRole]string, given map[string]bool) error {
	for _, r := range kitRoles {
		key, ok := keys[r.role]
		if !ok || r.flag == "" {
			continue
		}
		if err := kitKeyFault(key); err != nil {
			name := "SANDBOX_CHECK_" + strings.ToUpper(strings.ReplaceAll(r.flag, "-", "_"))
			if given[r.flag] {
				name = "-" + r.flag
			}
			return &kitUsageError{r.flag, fmt.Errorf("%s: %v", name, err)}
		}
	}
	return nil
}

// ruleNames are the rule ids or prefixes names lists, each naming a rule.
func ruleNames(names []string) ([]string, error) {
	for _, n := range names {
		if len(rulesNamed(n)) == 0 {
			return nil, fmt.Errorf("%q names no rule (docs/conformance.md lists them)", n)
		}
	}
	return names, nil
}

// readExpectations reads an -expect file: a JSON object of rule id (or prefix ending in *)
// to reason, each naming a rule.
func readExpectations(file string) (map[string]string, error) {
	b, err := os.ReadFile(file)
	var expect map[string]string
	if err == nil {
		err = json.Unmarshal(b, &expect)
	}
	if err != nil || expect == nil {
		return nil, fmt.Errorf("%s: want a JSON object of rule id to reason, such as {\"tracking.ambiguous_number\":\"the live adapter answers 409\"}: %v", file, err)
	}
	for id := range expect {
		if len(rulesNamed(id)) == 0 {
			return nil, fmt.Errorf("%s: %q names no rule", file, id)
		}
	}
	return expect, nil
}

// kitCall is a run of the kit as its caller asks for it: the command (go run . check), or the
// MCP door's check_server. Both go through runKit, the kit's one entry, which knows nothing of
// the server: a caller that checks this sandbox hands it the server's own transport, or what
// starts one (main's startSelfCheck).
type kitCall struct {
	args      []string            // check's flags
	getenv    func(string) string // SANDBOX_CHECK_<NAME>
	usage     io.Writer           // where -h writes
	transport http.RoundTripper   // nil: the network
	selfCheck func() (base string, stop func(), err error)
	until     time.Time // judging stops then, and the rules not judged are skipped; zero: never
}

// kitRan is what a run of the kit gives its caller: its report, or why there is none (a
// usage error naming its flag, a server the kit could not judge, an interruption), and what
// it says beside the report. Every word of it is masked.
type kitRan struct {
	cfg         checkConfig
	report      *checkReport
	help        bool   // -h was asked for, and written
	flag        string // the flag a usage error names
	usage       error
	err         error
	said        []string // the sandboxes it could not delete, an interruption
	interrupted bool
}

// runKit is the kit's one entry: its flags, the server (started by the caller's selfCheck
// when no -base-url is given), the run.
func runKit(ctx context.Context, call kitCall) kitRan {
	cfg, err := parseCheckConfig(call.args, call.getenv, cmp.Or[io.Writer](call.usage, io.Discard))
	ran := kitRan{cfg: cfg, help: errors.Is(err, flag.ErrHelp)}
	var usage *kitUsageError
	switch {
	case ran.help:
		return ran
	case errors.As(err, &usage):
		ran.flag, ran.usage = usage.flag, errors.New(newSecrets(cfg.keys).mask(err.Error()))
		return ran
	case cfg.baseURL == "" && call.selfCheck == nil:
		ran.flag, ran.usage = "base-url", errors.New("-base-url: the server under check is required here")
		return ran
	case cfg.baseURL == "":
		base, stop, err := call.selfCheck()
		if err != nil {
			ran.err = fmt.Errorf("starting this sandbox: %w", err)
			return ran
		}
		defer stop()
		cfg.baseURL, ran.cfg = base, cfg
	}
	k := newKit(ctx, cfg, call.until)
	if call.transport != nil {
		k.client.Transport = call.transport
	}
	ran.report, err = k.run()
	for _, w := range k.cleanup {
		ran.said = append(ran.said, k.secrets.mask(w))
	}
	switch {
	case ctx.Err() != nil:
		ran.interrupted, ran.report = true, nil
		ran.said = append(ran.said, k.secrets.mask("interrupted: "+k.cleanupSummary()))
	case err != nil:
		ran.err = errors.New(k.secrets.mask(err.Error()))
	}
	return ran
}

// jsonReport is what the MCP door's check_server answers of a run: its report as one line
// of compact JSON (over stdio a message is a line) and the summary's line; or the flag a
// usage error names ("-" for one that names none), and the error.
func (ran kitRan) jsonReport() (report []byte, summary, flagAtFault string, err error) {
	switch {
	case ran.usage != nil:
		return nil, "", cmp.Or(ran.flag, "-"), ran.usage
	case ran.err != nil:
		return nil, "", "", ran.err
	case ran.report == nil:
		return nil, "", "", errors.New("the call was cut off")
	}
	var b, compact bytes.Buffer
	ran.report.render(&b, "json")
	json.Compact(&compact, b.Bytes())
	s := ran.report.Summary
	return compact.Bytes(), fmt.Sprintf("%d rules: %d passed, %d failed (%d MUST), %d skipped", s.Total, s.Passed, s.Failed, s.FailedMust, s.Skipped), "", nil
}

// runCheck is the kit's command: check diff, or a run (runKit), its report and its exit
// status. A signal stops the run, deletes the kit's sandboxes and exits 130 within 5 s.
// Whatever it writes is masked. selfCheck starts the sandbox checked without -base-url.
func runCheck(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, selfCheck func() (string, func(), error)) int {
	if len(args) > 0 && args[0] == "diff" {
		return runDiff(args[1:], stdout, stderr)
	}
	ran := runKit(ctx, kitCall{args: args, getenv: getenv, usage: stdout, selfCheck: selfCheck})
	say := func(s string) { fmt.Fprintln(stderr, "sandbox check: "+s) }
	for _, w := range ran.said {
		say(w)
	}
	switch {
	case ran.help:
		return checkPassed
	case ran.interrupted:
		return checkInterrupted
	case ran.usage != nil:
		say(ran.usage.Error())
		return checkCannotJudge
	case ran.err != nil:
		say(ran.err.Error())
		return checkCannotJudge
	}
	if err := writeCheckReport(ran.cfg.out, stdout, ran.report, ran.cfg.format); err != nil {
		say("writing the report: " + err.Error())
		return checkCannotJudge
	}
	s := ran.report.Summary
	if s.FailedMust > 0 || s.Stale > 0 || ran.cfg.strict && s.Failed > 0 {
		return checkFailed
	}
	return checkPassed
}

// writeCheckReport writes the report in format to the file out, or to stdout.
func writeCheckReport(out string, stdout io.Writer, rep *checkReport, format string) error {
	var b bytes.Buffer
	if err := rep.render(&b, format); err != nil {
		return err
	}
	if out == "" {
		_, err := stdout.Write(b.Bytes())
		return err
	}
	return os.WriteFile(out, b.Bytes(), 0o644)
}

// ===== check: its requests, and what it keeps of their answers =====

// kit is one run of the conformance kit.
type kit struct {
	ctx      context.Context
	stop     context.CancelCauseFunc // ends the run early: the server refused the kit's pace
	release  context.CancelFunc      // lets go of the deadline the caller gave it, once run
	cfg      checkConfig
	base     string // the API's base, without a trailing /
	host     string // the base URL's host: keys go there only
	client   *http.Client
	keys     map[kitRole]string // the run's keys by role: those given, then its own world's
	secrets  *secrets           // every key the run was given or made: what it writes never holds
	world    *kitWorld
	rule     string                 // the rule whose requests are being sent
	used     map[string][]*exchange // each rule's answers, reused ones included
	cache    map[string]*exchange   // the GETs answered, by key role and target
	pace     kitPace
	requests atomic.Int64 // sent, retries included (the burst sends from several goroutines)
	retried  int          // 429s waited out
	warnings []string     // what makes a pass meaningless, or what the kit could not do
	cleanup  []string     // the kit's sandboxes it could not delete, for the report and standard error
	deleted  int          // the kit's sandboxes deleted
	judged   []*exchange  // the answers the rules that judge every answer judge
	bursted  []*exchange  // the rate limit's burst, once sent
	// The current rule's first request cut by -timeout: the rule ends there, failing, and
	// sends nothing more (a server that stalls every read costs a -timeout a rule).
	cut atomic.Pointer[exchange]
}

// The bounds of what the kit reads of an answer: more fails the rule that read it.
const (
	maxKitAnswer  = 1 << 20  // its body
	maxKitHeaders = 64 << 10 // its header fields, as a server's MaxHeaderBytes bounds a request's
	maxKitField   = 512      // what an evidence cites of a body, or of any field a server sent
)

var (
	errAnswerTooLarge  = fmt.Errorf("the answer's body is over %d bytes (1 MiB), the most the kit reads", maxKitAnswer)
	errHeadersTooLarge = fmt.Errorf("the answer's header fields are over %d bytes (64 KiB), the most the kit reads", maxKitHeaders)
	errPaceRefused     = errors.New("the server refused the kit's pace")
	errRuleCut         = errors.New("not sent: an earlier request of this rule got no answer within -timeout")
)

func newKit(ctx context.Context, cfg checkConfig, until time.Time) *kit {
	u, _ := url.Parse(cfg.baseURL)
	k := &kit{cfg: cfg, base: cfg.baseURL, host: u.Host, keys: maps.Clone(cfg.keys), secrets: newSecrets(cfg.keys),
		used: map[string][]*exchange{}, cache: map[string]*exchange{}, pace: kitPace{next: map[string]time.Time{}}}
	k.release = func() {}
	if !until.IsZero() {
		ctx, k.release = context.WithDeadlineCause(ctx, until, errTimeUp)
	}
	k.ctx, k.stop = context.WithCancelCause(ctx)
	k.client = &http.Client{
		Timeout: cfg.timeout, // the whole request, the answer read
		// A redirect is an answer, judged as such: its Location is never requested, so a key
		// never goes to another host.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		// A body of more than a few packets is sent with Expect: 100-continue, so that a server
		// that answers before reading it (a 413) and closes is read, not lost to the write its
		// close cut; a server that ignores Expect gets the body after ExpectContinueTimeout.
		Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 4, MaxResponseHeaderBytes: maxKitHeaders, ExpectContinueTimeout: kitExpectContinue},
	}
	return k
}

// kitExpectContinue is how long the kit waits for a 100 Continue before it sends a large
// body anyway, and kitLargeBody the body past which it asks for one.
const (
	kitExpectContinue = 2 * time.Second
	kitLargeBody      = 16 << 10
)

// kitRequest is one request of the kit: its key by role (or a key no server holds,
// unknownKey), a body, further header fields, and the answer it should get: its status and,
// for an error, the code the contract gives it (what errors.codes judges).
type kitRequest struct {
	method, target string // target: the path after the base URL, and its query
	role           kitRole
	unknownKey     string
	body           []byte
	header         []string // name, value, ...
	status         int
	code           string
}

// exchange is a request the kit sent and what came back.
type exchange struct {
	req    kitRequest
	rule   string
	status int // 0: no answer
	header http.Header
	body   []byte
	err    error // no answer, or one the kit would not read whole
}

// get sends GET target with role's key, expecting status (and code), or reuses the answer an
// earlier rule got to the same request.
func (k *kit) get(role kitRole, target string, status int, code string) *exchange {
	return k.send(kitRequest{method: http.MethodGet, target: target, role: role, status: status, code: code})
}

// send sends r unless the same GET was answered already, and notes the answer as the
// current rule's. A 429 is waited out (as its Retry-After says, at most -timeout) and r
// sent again, at most three times; 10 requests in a row still answered 429 end the run.
func (k *kit) send(r kitRequest) *exchange {
	if k.cut.Load() != nil {
		return &exchange{req: r, rule: k.rule, err: errRuleCut}
	}
	id := string(r.role) + " " + r.unknownKey + " " + r.method + " " + r.target
	cacheable := r.method == http.MethodGet && r.body == nil && r.header == nil
	if ex := k.cache[id]; ex != nil && cacheable {
		k.used[k.rule] = append(k.used[k.rule], ex)
		return ex
	}
	ex := k.sendOnce(r)
	for tries := 0; ex.status == http.StatusTooManyRequests && tries < 3 && k.ctx.Err() == nil && k.cut.Load() == nil; tries++ {
		k.retried++
		k.wait(retryAfter(ex.header, time.Now()))
		ex = k.sendOnce(r)
	}
	k.pace.answered(k, ex.status == http.StatusTooManyRequests)
	if cacheable && ex.err == nil {
		k.cache[id] = ex
	}
	k.used[k.rule] = append(k.used[k.rule], ex)
	return ex
}

// keyFor is the key r is sent with: its role's, or the unknown key it names.
func (k *kit) keyFor(r kitRequest) string {
	if r.unknownKey != "" {
		return r.unknownKey
	}
	return k.keys[r.role]
}

// sendOnce sends r once, no faster than the server's RateLimit says its key may.
func (k *kit) sendOnce(r kitRequest) *exchange {
	ex := &exchange{req: r, rule: k.rule}
	key := k.keyFor(r)
	if at := k.pace.turn(key); time.Now().Before(at) {
		k.wait(time.Until(at))
	}
	if err := k.ctx.Err(); err != nil {
		ex.err = err
		return ex
	}
	req, err := k.httpRequest(r, key)
	if err != nil {
		ex.err = err
		return ex
	}
	k.requests.Add(1)
	res, err := k.client.Do(req)
	if err != nil {
		if strings.Contains(err.Error(), "response headers exceeded") {
			err = errHeadersTooLarge
		}
		ex.err = err
		k.noteCut(ex)
		return ex
	}
	defer res.Body.Close()
	ex.status, ex.header = res.StatusCode, res.Header
	ex.body, err = io.ReadAll(io.LimitReader(res.Body, maxKitAnswer+1))
	switch {
	case err != nil:
		ex.err = err
		k.noteCut(ex)
	case len(ex.body) > maxKitAnswer:
		ex.body, ex.err = ex.body[:maxKitAnswer], errAnswerTooLarge
	}
	k.pace.note(key, res.Header)
	return ex
}

// noteCut notes ex as the current rule's first request cut by -timeout, if it was one. The
// first read and the world are not rules: a cut there is judged where it happens.
func (k *kit) noteCut(ex *exchange) {
	var timeout net.Error
	if errors.As(ex.err, &timeout) && timeout.Timeout() && !strings.HasPrefix(k.rule, "(") {
		k.cut.CompareAndSwap(nil, ex)
	}
}

// httpRequest is r as sent to the base URL's host, with key.
func (k *kit) httpRequest(r kitRequest, key string) (*http.Request, error) {
	var body io.Reader
	if r.body != nil {
		body = bytes.NewReader(r.body)
	}
	req, err := http.NewRequestWithContext(k.ctx, r.method, k.base+r.target, body)
	if err != nil {
		return nil, err
	}
	if req.URL.Host != k.host { // keys go to the base URL's host only
		return nil, fmt.Errorf("the request names host %q, not the base URL's", req.URL.Host)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if r.body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if len(r.body) > kitLargeBody {
		req.Header.Set("Expect", "100-continue")
	}
	for i := 0; i+1 < len(r.header); i += 2 {
		req.Header.Set(r.header[i], r.header[i+1])
	}
	return req, nil
}

// ===== check: its pace =====

// kitPace is how fast the kit may send: by key, when the server's RateLimit lets it send
// again; and how often in a row the server refused its pace.
type kitPace struct {
	mu      sync.Mutex           // the burst sends from several goroutines
	next    map[string]time.Time // by key
	off     bool                 // during the rate limit's burst
	limited int                  // requests in a row still answered 429 after their retries
	cut     int                  // waits in a row cut to -timeout
}

// maxRefusedInARow is how many requests in a row still answered 429, or waits in a row cut
// to -timeout, end a run: a server that answers 429 to everything, or asks for endless
// waits, is not judged rule by rule against a wall.
const maxRefusedInARow = 10

// turn is when key may send again.
func (p *kitPace) turn(key string) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.off {
		return time.Time{}
	}
	return p.next[key]
}

// note reads an answer's RateLimit fields: with no request left, key waits what they say.
func (p *kitPace) note(key string, h http.Header) {
	wait, ok := rateWait(h)
	p.mu.Lock()
	defer p.mu.Unlock()
	if ok && !p.off && key != "" {
		p.next[key] = time.Now().Add(wait)
	}
}

// answered counts a request's last answer: still a 429, or not.
func (p *kitPace) answered(k *kit, limited bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !limited {
		p.limited = 0
		return
	}
	if p.limited++; p.limited >= maxRefusedInARow {
		k.stop(fmt.Errorf("%w: %d requests in a row were still answered 429 after three retries each", errPaceRefused, p.limited))
	}
}

// wait waits d, cut to -timeout, or until the run ends; 10 cuts in a row end it.
func (k *kit) wait(d time.Duration) {
	k.pace.mu.Lock()
	if d > k.cfg.timeout {
		d = k.cfg.timeout
		if k.pace.cut++; k.pace.cut >= maxRefusedInARow {
			k.stop(fmt.Errorf("%w: it asked for %d waits in a row longer than -timeout %v (RateLimit or Retry-After)", errPaceRefused, k.pace.cut, k.cfg.timeout))
		}
	} else if d > 0 {
		k.pace.cut = 0
	}
	k.pace.mu.Unlock()
	sleepCtx(k.ctx, d)
}

// retryAfter is what a 429's Retry-After asks for, at now: delay-seconds or an HTTP-date
// (RFC 9110, 10.2.3); 1 s when absent or unreadable.
func retryAfter(h http.Header, now time.Time) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if s, err := strconv.ParseUint(v, 10, 32); err == nil {
		return time.Duration(s) * time.Second
	}
	if at, err := http.ParseTime(v); err == nil {
		return max(at.Sub(now), 0)
	}
	return time.Second
}

// rateWait reads the IETF draft's RateLimit fields: with no request left (r=0), the next
// waits one request's share of the policy's window (w/q), or the time the limit says it
// resets in (t) without a policy.
func rateWait(h http.Header) (time.Duration, bool) {
	limit, _ := parseRateLimitField(h.Values("RateLimit"))
	policy, _ := parseRateLimitField(h.Values("RateLimit-Policy"))
	if len(limit) == 0 {
		return 0, false
	}
	if left, ok := limit[0].params["r"]; !ok || left != 0 {
		return 0, false
	}
	if len(policy) > 0 && policy[0].params["q"] > 0 && policy[0].params["w"] > 0 {
		return time.Duration(policy[0].params["w"]) * time.Second / time.Duration(policy[0].params["q"]), true
	}
	if t, ok := limit[0].params["t"]; ok && t > 0 {
		return time.Duration(min(t, math.MaxInt32)) * time.Second, true
	}
	return 0, false
}

// rateLimitItem is an item of a RateLimit or RateLimit-Policy field (an RFC 8941 list): the
// policy's name, and its integer parameters.
type rateLimitItem struct {
	name   string
	params map[string]int64
}

// parseRateLimitField reads a RateLimit or RateLimit-Policy field, its lines joined: a list
// of items, each a string or a token with parameters ;key=integer. Anything else is a fault.
func parseRateLimitField(lines []string) ([]rateLimitItem, error) {
	var items []rateLimitItem
	for _, member := range strings.Split(strings.Join(lines, ","), ",") {
		parts := strings.Split(strings.TrimSpace(member), ";")
		name := parts[0]
		if unq, err := strconv.Unquote(name); err == nil && strings.HasPrefix(name, `"`) {
			name = unq
		} else if name == "" || strings.Trim(strings.ToLower(name), "abcdefghijklmnopqrstuvwxyz0123456789_-.:*/") != "" {
			return nil, fmt.Errorf("%q is not a policy's name (a string or a token)", parts[0])
		}
		item := rateLimitItem{name: name, params: map[string]int64{}}
		for _, p := range parts[1:] {
			key, value, _ := strings.Cut(strings.TrimSpace(p), "=")
			n, err := strconv.ParseInt(value, 10, 64)
			if key == "" || strings.Trim(key, "abcdefghijklmnopqrstuvwxyz0123456789_-.*") != "" || err != nil || len(value) > 15 {
				return nil, fmt.Errorf("%q is not a parameter key=integer", strings.TrimSpace(p))
			}
			item.params[key] = n
		}
		items = append(items, item)
	}
	return items, nil
}

// ===== check: results and their evidence, each request a curl command =====

// What the kit writes of a server's answers and of a user's keys is masked, escaped and cut
// as the shared section says; a failure's evidence cites each request as the curl command
// that sends it again.

// curl is r as a command that sends it exactly as the kit did (its method, its header
// fields, its body, quoted for a POSIX shell), each key a variable named for its role.
func (k *kit) curl(r kitRequest) string {
	parts := []string{"curl -s -i"}
	if r.method != http.MethodGet || r.body != nil { // with a body, curl would otherwise POST
		parts = append(parts, "-X "+r.method)
	}
	switch {
	case r.unknownKey != "":
		parts = append(parts, "-H "+shellQuote("Authorization: Bearer "+r.unknownKey))
	case r.role != roleNone:
		parts = append(parts, `-H "Authorization: Bearer $`+string(r.role)+`"`)
	}
	if r.body != nil {
		parts = append(parts, "-H 'Content-Type: application/json'")
	}
	for i := 0; i+1 < len(r.header); i += 2 {
		parts = append(parts, "-H "+shellQuote(r.header[i]+": "+r.header[i+1]))
	}
	switch {
	case len(r.body) > 1024 && len(bytes.Trim(r.body, string(r.body[:1]))) == 0: // one byte, repeated
		parts = append(parts, fmt.Sprintf(`--data-binary @<(head -c %d /dev/zero | tr '\0' %s)`, len(r.body), shellQuote(string(r.body[:1]))))
	case r.body != nil:
		parts = append(parts, "--data-binary "+shellQuote(string(r.body)))
	}
	return strings.Join(append(parts, shellQuote(k.base+r.target)), " ")
}

// ruleResult is what a rule's judge found: a pass, a skip (with its reason) or a failure
// (with its evidence); the report makes a failure that -expect names expected.
type ruleResult struct {
	result   string // pass, fail, skip or expected
	reason   string
	evidence []checkEvidence
	failures int // how many answers failed the rule: the evidence cites the first maxCited
}

// maxCited is how many failures a rule's evidence cites; it says how many there were.
const maxCited = 5

// skip is a rule that cannot be judged, saying why.
func skip(reason string) ruleResult { return ruleResult{result: "skip", reason: reason} }

// fail notes a failure of the rule: what it expected and what it saw in ex, with the
// request as a curl command and its answer's Request-Id, each field bounded.
func (v *ruleResult) fail(k *kit, ex *exchange, expected, seen string) {
	v.result = "fail"
	v.failures++
	if len(v.evidence) == maxCited {
		return
	}
	e := checkEvidence{Expected: cutField(expected, 4*maxKitField), Curl: k.curl(ex.req)}
	switch {
	case ex.status == 0 && ex.err != nil:
		e.Seen = "no answer: " + ex.err.Error()
	default:
		e.Status, e.RequestID = ex.status, cutField(strings.Join(ex.header.Values("Request-Id"), ", "), maxKitField)
		e.Seen = cutField(seen, 2*maxKitField)
		if ex.err != nil {
			e.Seen += " (" + ex.err.Error() + ")"
		}
		if len(ex.body) > 0 {
			e.Seen += "; body: " + cutField(strings.ToValidUTF8(string(ex.body), "\ufffd"), maxKitField)
		}
	}
	v.evidence = append(v.evidence, e)
}

// settled is v once judged: a rule that found no failure and was not skipped passes; a
// rule of more failures than it cites says how many.
func (v ruleResult) settled() ruleResult {
	if v.result == "" {
		v.result = "pass"
	}
	if v.failures > 1 {
		for i := range v.evidence {
			v.evidence[i].Seen = fmt.Sprintf("[%d of %d answers that failed this rule; the first %d are cited] %s", i+1, v.failures, len(v.evidence), v.evidence[i].Seen)
		}
	}
	return v
}

// wantStatus fails v unless ex answered status, its body read whole; it reports whether it
// did.
func (v *ruleResult) wantStatus(k *kit, ex *exchange, status int, what string) bool {
	if ex.err == nil && ex.status == status {
		return true
	}
	v.fail(k, ex, fmt.Sprintf("%s: %d", what, status), fmt.Sprintf("status %d", ex.status))
	return false
}

type checkEvidence struct {
	Expected  string `json:"expected"`
	Seen      string `json:"seen"`
	Status    int    `json:"status"`
	Curl      string `json:"curl"`
	RequestID string `json:"request_id"`
}

// ===== check: JSON, read with its own eyes =====

// jsonValue is a JSON value as the kit reads it, with a reader of its own: an object keeps
// its members in the order written and the names it repeats (a member written twice is a
// fault the server's own types would hide), a number its text (judged by its value, so
// 20.0 is 20).
type jsonValue struct {
	typ      jsonType
	boolean  bool
	text     string // a string's, or a number's as written
	items    []*jsonValue
	members  []jsonMember
	repeated []string // names written twice or more
}

type jsonMember struct {
	name  string
	value *jsonValue
}

// jsonType is the type of a JSON value, or the type a member must have.
type jsonType uint8

const (
	typeNull jsonType = iota
	typeBool
	typeNumber
	typeString
	typeArray
	typeObject
	typeStringOrNull // a member's type only
	typeInteger      // a member's type only: a number whose value is whole
)

var jsonTypeNames = []string{"null", "true or false", "a number", "a string", "an array", "an object", "a string or null", "an integer"}

// maxKitDepth is how deep the kit reads nested arrays and objects: deeper is not an answer of
// the API.
const maxKitDepth = 64

// readJSON reads body as one JSON value; the value read so far and an error when it is not
// one (cut short, say).
func readJSON(body []byte) (*jsonValue, error) {
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	root, err := readJSONValue(d)
	if err == nil && d.More() {
		err = errors.New("data after the JSON value")
	}
	return root, err
}

// readJSONValue reads one value off d without recursion: a stack of the arrays and objects
// open, and, for an object, the name whose value comes next.
func readJSONValue(d *json.Decoder) (*jsonValue, error) {
	type open struct {
		v    *jsonValue
		name *string
	}
	var stack []open
	var root *jsonValue
	for {
		tok, err := d.Token()
		if err != nil {
			return root, err
		}
		if n := len(stack); n > 0 && stack[n-1].v.typ == typeObject && stack[n-1].name == nil {
			if name, ok := tok.(string); ok {
				stack[n-1].name = &name
				continue
			}
		}
		v := jsonScalarOf(tok)
		if delim, ok := tok.(json.Delim); ok && (delim == '}' || delim == ']') {
			if stack = stack[:len(stack)-1]; len(stack) == 0 {
				return root, nil
			}
			continue
		}
		switch n := len(stack); {
		case n == 0:
			root = v
		case stack[n-1].v.typ == typeArray:
			stack[n-1].v.items = append(stack[n-1].v.items, v)
		default:
			stack[n-1].v.add(*stack[n-1].name, v)
			stack[n-1].name = nil
		}
		if v.typ == typeArray || v.typ == typeObject {
			if stack = append(stack, open{v: v}); len(stack) > maxKitDepth {
				return root, fmt.Errorf("arrays and objects nested deeper than %d", maxKitDepth)
			}
		} else if len(stack) == 0 {
			return root, nil
		}
	}
}

// jsonScalarOf is the value a token opens or is.
func jsonScalarOf(tok json.Token) *jsonValue {
	switch t := tok.(type) {
	case json.Delim:
		if t == '{' {
			return &jsonValue{typ: typeObject}
		}
		return &jsonValue{typ: typeArray}
	case bool:
		return &jsonValue{typ: typeBool, boolean: t}
	case json.Number:
		return &jsonValue{typ: typeNumber, text: string(t)}
	case string:
		return &jsonValue{typ: typeString, text: t}
	}
	return &jsonValue{typ: typeNull}
}

// add adds a member to an object, noting a name written twice.
func (v *jsonValue) add(name string, value *jsonValue) {
	if _, ok := v.member(name); ok && !slices.Contains(v.repeated, name) {
		v.repeated = append(v.repeated, name)
	}
	v.members = append(v.members, jsonMember{name, value})
}

// member is the value of an object's member name (the first, when it is repeated).
func (v *jsonValue) member(name string) (*jsonValue, bool) {
	if v == nil {
		return nil, false
	}
	for _, m := range v.members {
		if m.name == name {
			return m.value, true
		}
	}
	return nil, false
}

// str is the string member name of an object, "" when it is none.
func (v *jsonValue) str(name string) string {
	if m, ok := v.member(name); ok && m.typ == typeString {
		return m.text
	}
	return ""
}

// strOrNull is the string or null member name: nil for null, or for none.
func (v *jsonValue) strOrNull(name string) *string {
	if m, ok := v.member(name); ok && m.typ == typeString {
		return &m.text
	}
	return nil
}

// number is a number's value, exactly.
func (v *jsonValue) number() (*big.Rat, bool) {
	if v == nil || v.typ != typeNumber {
		return nil, false
	}
	return new(big.Rat).SetString(v.text)
}

// integer is a whole number's value; false for any other value, or one past int64.
func (v *jsonValue) integer() (int64, bool) {
	n, ok := v.number()
	if !ok || !n.IsInt() || !n.Num().IsInt64() {
		return 0, false
	}
	return n.Num().Int64(), true
}

// is reports whether v has type t (a member's type included).
func (v *jsonValue) is(t jsonType) bool {
	switch t {
	case typeStringOrNull:
		return v.typ == typeString || v.typ == typeNull
	case typeInteger:
		_, ok := v.integer()
		return ok
	}
	return v.typ == t
}

// equal reports whether v and w are the same JSON value: numbers by value, objects by their
// members whatever their order, and neither repeating a name.
func (v *jsonValue) equal(w *jsonValue) bool {
	switch {
	case v == nil || w == nil:
		return v == w
	case v.typ != w.typ:
		return false
	case v.typ == typeNumber:
		a, okA := v.number()
		b, okB := w.number()
		return okA && okB && a.Cmp(b) == 0
	case v.typ == typeArray:
		if len(v.items) != len(w.items) {
			return false
		}
		for i := range v.items {
			if !v.items[i].equal(w.items[i]) {
				return false
			}
		}
		return true
	case v.typ == typeObject:
		if len(v.members) != len(w.members) || len(v.repeated)+len(w.repeated) > 0 {
			return false
		}
		for _, m := range v.members {
			if o, ok := w.member(m.name); !ok || !m.value.equal(o) {
				return false
			}
		}
		return true
	}
	return v.boolean == w.boolean && v.text == w.text
}

// String is v as compact JSON, for evidence.
func (v *jsonValue) String() string {
	var b strings.Builder
	v.encode(&b)
	return b.String()
}

func (v *jsonValue) encode(b *strings.Builder) {
	switch v.typ {
	case typeNull:
		b.WriteString("null")
	case typeBool:
		b.WriteString(strconv.FormatBool(v.boolean))
	case typeNumber:
		b.WriteString(v.text)
	case typeString:
		q, _ := json.Marshal(v.text)
		b.Write(q)
	case typeArray:
		b.WriteByte('[')
		for i, x := range v.items {
			if i > 0 {
				b.WriteByte(',')
			}
			x.encode(b)
		}
		b.WriteByte(']')
	case typeObject:
		b.WriteByte('{')
		for i, m := range v.members {
			if i > 0 {
				b.WriteByte(',')
			}
			q, _ := json.Marshal(m.name)
			b.Write(q)
			b.WriteByte(':')
			m.value.encode(b)
		}
		b.WriteByte('}')
	}
}

// kitMember is a member an object must have, and its type.
type kitMember struct {
	name string
	typ  jsonType
}

// shapeFault is what is wrong with obj, named after prefix: not an object, a member written
// twice, one of shape missing or of another type; "" when nothing is.
func shapeFault(obj *jsonValue, shape []kitMember, prefix string) string {
	switch {
	case obj == nil || obj.typ != typeObject:
		return strings.TrimSuffix(prefix, ".") + " is not an object"
	case len(obj.repeated) > 0:
		return fmt.Sprintf("member %s%s written twice", prefix, obj.repeated[0])
	}
	for _, m := range shape {
		v, ok := obj.member(m.name)
		if !ok {
			return "member " + prefix + m.name + " missing"
		}
		if !v.is(m.typ) {
			return fmt.Sprintf("member %s%s is %s, not %s", prefix, m.name, cutField(v.String(), 64), jsonTypeNames[m.typ])
		}
	}
	return ""
}

// memberBeyond is the first member of obj that shape does not name, after prefix; "" when
// there is none.
func memberBeyond(obj *jsonValue, shape []kitMember, prefix string) string {
	if obj == nil {
		return ""
	}
	for _, m := range obj.members {
		if !slices.ContainsFunc(shape, func(s kitMember) bool { return s.name == m.name }) {
			return "member " + prefix + m.name + " beyond the spec's"
		}
	}
	return ""
}

// repeatedMember is the path of the first member written twice anywhere in v, or "".
func repeatedMember(v *jsonValue, path string) string {
	if v == nil {
		return ""
	}
	if len(v.repeated) > 0 {
		return path + "." + v.repeated[0]
	}
	for i, x := range v.items {
		if p := repeatedMember(x, fmt.Sprintf("%s[%d]", path, i)); p != "" {
			return p
		}
	}
	for _, m := range v.members {
		if p := repeatedMember(m.value, path+"."+m.name); p != "" {
			return p
		}
	}
	return ""
}

// ===== check: its world =====

// Where the server makes sandboxes, the kit judges data it chose: two sandboxes of records it
// sends (the main account's, holding evidence for every rule and keys of every kind, and
// another account's), deleted at the end. Everything it sends is in the tables below, each
// shipment with the events it sends beside the events the spec's normalization shows, so
// that each view and order it reads is judged against what it sent. On any other server it
// reads what its keys can read, and a rule without the data it needs is skipped, saying why.

// kitShipment is a shipment of the kit's own world: what it sends, and the view the spec's
// normalization makes of it.
type kitShipment struct {
	id, reference string
	number        string   // its primary tracking number; "" for null
	parcels       []string // further parcels' numbers
	order         string   // the order it is created with; "" for none
	status        string   // the view's status: its last shown event's (pre_transit without one)
	events        []kitEvent
}

// kitEvent is an event of a kit shipment: sent with its timestamp as written, shown at the
// instant shown, in UTC ("" when the spec's normalization shows it not at all: no offset, or
// the duplicate of an earlier event). Its location is sent when not "", and shown as sent.
type kitEvent struct {
	sent, shown, status, description, location string
}

// kitShipments are the main account's shipments: every tracking status, and the evidence of
// every rule of the views.
var kitShipments = []kitShipment{
	{id: "shp_ck_dst", reference: "CK-REF-DST", number: "CK1000000001", status: "delivered", events: []kitEvent{
		// Across the UK's change to summer time (2025-03-30T01:00:00Z), in two offsets, out of order.
		{"2025-03-30T02:30:00+01:00", "2025-03-30T01:30:00Z", "in_transit", "Arrived at hub", "Birmingham, GB"},
		{"2025-03-30T00:30:00+00:00", "2025-03-30T00:30:00Z", "in_transit", "Departed facility", "Heathrow, GB"},
		{"2025-03-29T23:15:00Z", "2025-03-29T23:15:00Z", "pre_transit", "Label created", "London, GB"},
		{"2025-03-30T09:15:00+01:00", "2025-03-30T08:15:00Z", "delivered", "Delivered", "Manchester, GB"},
	}},
	{id: "shp_ck_dup", reference: "CK-REF-DUP", number: "CK1000000002", status: "delivered", events: []kitEvent{
		{"2025-04-01T10:00:00Z", "2025-04-01T10:00:00Z", "in_transit", "Departed facility", "Leeds, GB"},
		{"2025-04-01T11:00:00+01:00", "", "in_transit", "Departed facility", "York, GB"},       // its instant and description: a duplicate
		{"2025-04-01T10:00:00Z", "2025-04-01T10:00:00Z", "in_transit", "Scanned", "Leeds, GB"}, // its instant, another description: after it
		{"2025-04-01T15:00:00Z", "2025-04-01T15:00:00Z", "delivered", "Delivered", "York, GB"},
	}},
	{id: "shp_ck_naive", reference: "CK-REF-NAIVE", number: "CK1000000003", status: "in_transit", events: []kitEvent{
		{"2025-04-02T09:00:00", "", "delivered", "Collected", "Bristol, GB"}, // no offset: not interpreted, not shown
		{"2025-04-02T10:00:00Z", "2025-04-02T10:00:00Z", "in_transit", "Departed facility", "Bristol, GB"},
	}},
	{id: "shp_ck_parcels", reference: "CK-REF-PARCELS", number: "CK1000000004", parcels: []string{"CK1000000005"}, status: "in_transit", events: []kitEvent{
		{"2025-04-03T08:00:00Z", "2025-04-03T08:00:00Z", "in_transit", "In transit", ""}, // no location: ""
	}},
	{id: "shp_ck_twin_a", reference: "CK-REF-TWIN-A", number: "CK2000000000", status: "in_transit", events: []kitEvent{
		{"2025-04-04T08:00:00Z", "2025-04-04T08:00:00Z", "in_transit", "In transit", "Leicester, GB"},
	}},
	{id: "shp_ck_twin_b", reference: "CK-REF-TWIN-B", number: "CK2000000000", status: "in_transit", events: []kitEvent{
		{"2025-04-04T09:00:00Z", "2025-04-04T09:00:00Z", "in_transit", "In transit", "Leicester, GB"},
	}},
	{id: "shp_ck_linked", reference: "CK-REF-LINKED", number: "CK1000000006", order: "ord_ck_0002", status: "pre_transit", events: []kitEvent{
		{"2025-06-01T13:00:00Z", "2025-06-01T13:00:00Z", "pre_transit", "Label created", "Leeds, GB"},
	}},
	{id: "shp_ck_unlabelled", reference: "CK-REF-UNLABELLED", status: "pre_transit"},
	{id: "shp_ck_out", reference: "CK-REF-OUT", number: "CK3000000001", status: "out_for_delivery", events: []kitEvent{
		{"2025-04-05T06:00:00+01:00", "2025-04-05T05:00:00Z", "out_for_delivery", "Out for delivery", "Leeds, GB"},
	}},
	{id: "shp_ck_pickup", reference: "CK-REF-PICKUP", number: "CK3000000002", status: "available_for_pickup", events: []kitEvent{
		{"2025-04-05T09:00:00Z", "2025-04-05T09:00:00Z", "in_transit", "In transit", "York, GB"},
		{"2025-04-05T14:00:00Z", "2025-04-05T14:00:00Z", "available_for_pickup", "Available for collection", "York, GB"},
	}},
	{id: "shp_ck_returned", reference: "CK-REF-RETURNED", number: "CK3000000003", status: "return_to_sender", events: []kitEvent{
		{"2025-04-06T16:00:00Z", "2025-04-06T16:00:00Z", "return_to_sender", "Returned to sender", "Bath, GB"},
	}},
	{id: "shp_ck_failed", reference: "CK-REF-FAILED", number: "CK3000000004", status: "failure", events: []kitEvent{
		{"2025-04-07T12:00:00Z", "2025-04-07T12:00:00Z", "failure", "Delivery failed: address not found", "Bath, GB"},
	}},
	{id: "shp_ck_cancelled", reference: "CK-REF-CANCELLED", number: "CK3000000005", status: "cancelled", events: []kitEvent{
		{"2025-04-08T07:00:00Z", "2025-04-08T07:00:00Z", "pre_transit", "Label created", "Bath, GB"},
		{"2025-04-08T08:00:00Z", "2025-04-08T08:00:00Z", "cancelled", "Label cancelled", "Bath, GB"},
	}},
	{id: "shp_ck_unrecognised", reference: "CK-REF-UNRECOGNISED", number: "CK3000000006", status: "unknown", events: []kitEvent{
		{"2025-04-09T10:00:00Z", "2025-04-09T10:00:00Z", "unknown", "Carrier status not recognised", "Bath, GB"},
	}},
}

// The main account's evidence that no single shipment row says: a further parcel's number,
// a number two shipments hold, and the order linked to a shipment.
const (
	kitFurtherNumber = "CK1000000005"
	kitSharedNumber  = "CK2000000000"
	kitLinkedOrder   = "ord_ck_0002"
	kitLinkedShip    = "shp_ck_linked"
)

// Ids and a number no server holds: the unknown resources of the rules, and, without the
// kit's own world, the ids of the requests that must never touch a resource.
const (
	unknownShipment = "shp_conformance_nowhere"
	unknownNumber   = "CONFORMANCE0NOWHERE"
	unknownOrder    = "ord_conformance_nowhere"
	unknownKey      = "conformance-unknown-key-0000" // shares no 8 characters with a key a run masks
)

// shown are the events s's view shows, oldest first, stable for one instant: the spec's
// normalization of what it sent.
func (s *kitShipment) shown() []kitEvent {
	var shown []kitEvent
	for _, e := range s.events {
		if e.shown != "" {
			shown = append(shown, e)
		}
	}
	slices.SortStableFunc(shown, func(a, b kitEvent) int { return strings.Compare(a.shown, b.shown) }) // one UTC format: text order is time order
	return shown
}

// record is s as the body of a sandbox sends it.
func (s *kitShipment) record() json.RawMessage {
	type event struct {
		Timestamp   string `json:"timestamp"`
		Status      string `json:"status"`
		Description string `json:"description"`
		Location    string `json:"location,omitempty"`
	}
	rec := struct {
		ID      string   `json:"id"`
		Ref     string   `json:"reference"`
		Number  *string  `json:"tracking_number"`
		Parcels []string `json:"parcel_tracking_numbers,omitempty"`
		Order   string   `json:"order_id,omitempty"`
		Events  []event  `json:"events"`
	}{ID: s.id, Ref: s.reference, Parcels: s.parcels, Order: s.order, Events: []event{}}
	if s.number != "" {
		rec.Number = &s.number
	}
	for _, e := range s.events {
		rec.Events = append(rec.Events, event{e.sent, e.status, e.description, e.location})
	}
	b, _ := json.Marshal(rec)
	return b
}

// kitOrder is an imported order as the kit sends it and as it must read it.
type kitOrder struct {
	ID         string  `json:"id"`
	Reference  string  `json:"merchant_reference"`
	Platform   string  `json:"platform"`
	Status     string  `json:"status"`
	ShipmentID *string `json:"shipment_id"`
	CreatedAt  string  `json:"created_at"`
}

// record is o as the body of a sandbox sends it: its fields but shipment_id (a shipment's
// order_id links it).
func (o kitOrder) record() json.RawMessage {
	b, _ := json.Marshal(struct {
		ID        string `json:"id"`
		Reference string `json:"merchant_reference"`
		Platform  string `json:"platform"`
		Status    string `json:"status"`
		CreatedAt string `json:"created_at"`
	}{o.ID, o.Reference, o.Platform, o.Status, o.CreatedAt})
	return b
}

// kitOrderCount is how many orders the main sandbox holds: more than two pages of 100, 65
// of each status.
const kitOrderCount = 260

// kitOrders are the main account's orders, in list order: every status and platform (4 and
// 5 are coprime: all 20 pairs), seven minutes apart, but that every sixth shares its
// created_at with the one before it (the id breaks the tie); the linked one shows its
// shipment. The created filters name the instants of orders 54 and 198.
func kitOrders() (orders []kitOrder, from, to string) {
	base := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	at := func(m int) string { return base.Add(-time.Duration(m) * 7 * time.Minute).Format(time.RFC3339) }
	for i := range kitOrderCount {
		m := i
		if i%6 == 1 {
			m = i - 1
		}
		o := kitOrder{ID: fmt.Sprintf("ord_ck_%04d", i), Reference: fmt.Sprintf("CK-ORDER-%04d", i), Platform: platforms[i%len(platforms)],
			Status: orderStatuses[i%len(orderStatuses)], CreatedAt: at(m)}
		if o.ID == kitLinkedOrder {
			o.ShipmentID = ptr(kitLinkedShip)
		}
		orders = append(orders, o)
	}
	slices.SortStableFunc(orders, func(a, b kitOrder) int { // created_at descending, then id descending
		return cmp.Or(strings.Compare(b.CreatedAt, a.CreatedAt), strings.Compare(b.ID, a.ID))
	})
	return orders, at(198), at(54)
}

func ptr[T any](v T) *T { return &v }

// The other account: an order and a shipment of its own, ids and number unlike the main's.
var (
	kitOtherOrder    = kitOrder{ID: "ord_alt_0001", Reference: "ALT-ORDER-1", Platform: "etsy", Status: "fulfilled", CreatedAt: "2025-05-01T09:00:00Z"}
	kitOtherShipment = kitShipment{id: "shp_alt_0001", reference: "ALT-REF-1", number: "ALT1000000001", order: "ord_alt_0001", status: "delivered",
		events: []kitEvent{{"2025-05-02T09:00:00Z", "2025-05-02T09:00:00Z", "delivered", "Delivered", "Cardiff, GB"}}}
)

// kitWorld is what the kit judges against.
type kitWorld struct {
	own       bool
	made      []kitSandbox            // the kit's sandboxes, to delete
	orders    []kitOrder              // the main account's orders: own, as sent, in list order; discovered, as listed
	shipments []string                // the shipments known, by id
	sent      map[string]*kitShipment // own: each shipment as sent
	numbers   map[string]string       // a primary number one shipment holds, as far as the kit knows, and its shipment
	linked    [2]string               // an order linked to a shipment, and the shipment
	from, to  string                  // the instants the created filters name, each some order's created_at
}

// kitSandbox is a sandbox the kit made: its account, and a key it can delete it with ("" when
// the server's answer gave none the kit can send).
type kitSandbox struct{ account, key string }

// makeWorld makes the kit's world: its own, when the server makes a sandbox of the records
// the kit sends with the keys it asks for, else what its keys read.
func (k *kit) makeWorld() *kitWorld {
	w := &kitWorld{numbers: map[string]string{}}
	orders, from, to := kitOrders()
	var body struct {
		Orders    []json.RawMessage `json:"orders"`
		Shipments []json.RawMessage `json:"shipments"`
		Keys      []json.RawMessage `json:"keys"`
	}
	for _, o := range orders {
		body.Orders = append(body.Orders, o.record())
	}
	for i := range kitShipments {
		body.Shipments = append(body.Shipments, kitShipments[i].record())
	}
	var roles []kitRole
	for _, r := range kitRoles {
		if r.asked != "" {
			body.Keys, roles = append(body.Keys, json.RawMessage(r.asked)), append(roles, r.role)
		}
	}
	keys, ok := k.requestSandbox(w, body, roles)
	if !ok {
		return k.readWorld(w)
	}
	for i, role := range roles {
		k.keys[role] = keys[i]
	}
	w.own, w.orders, w.from, w.to, w.linked, w.sent = true, orders, from, to, [2]string{kitLinkedOrder, kitLinkedShip}, map[string]*kitShipment{}
	for i := range kitShipments {
		s := &kitShipments[i]
		w.shipments, w.sent[s.id] = append(w.shipments, s.id), s
		if s.number != "" && s.number != kitSharedNumber {
			w.numbers[s.number] = s.id
		}
	}
	other := struct {
		Orders    []json.RawMessage `json:"orders"`
		Shipments []json.RawMessage `json:"shipments"`
	}{[]json.RawMessage{kitOtherOrder.record()}, []json.RawMessage{kitOtherShipment.record()}}
	if keys, ok := k.requestSandbox(w, other, []kitRole{roleAlt}); ok {
		k.keys[roleAlt] = keys[0]
	}
	return w
}

// requestSandbox asks the server for a sandbox of body (with -profile's profile, when it is
// not the default), with the main key and an Idempotency-Key of its own, and returns the
// keys it asked for, one for each of roles; false for any answer but a 201 that gives them.
// A 201 that does not is warned of, and what it made is deleted at the end. Every key it
// gives is masked from then on, under the role it was asked for.
func (k *kit) requestSandbox(w *kitWorld, body any, roles []kitRole) ([]string, bool) {
	n := len(roles)
	b, _ := json.Marshal(body)
	if k.cfg.profile != "sandbox" { // the member is sent only when it is not the default
		b = append(b[:len(b)-1], `,"profile":`+strconv.Quote(k.cfg.profile)+`}`...)
	}
	idem := make([]byte, 12)
	rand.Read(idem)
	ex := k.send(kitRequest{method: http.MethodPost, target: "/test_helpers/sandboxes", role: roleMain, body: b,
		header: []string{"Idempotency-Key", fmt.Sprintf("conformance-%x", idem)}, status: http.StatusCreated})
	if ex.status != http.StatusCreated {
		return nil, false
	}
	made, _ := readJSON(ex.body) // a 201 cut at 1 MiB is read as far as it goes, to delete what it made
	account := made.str("account")
	items, _ := made.member("keys")
	var keys []string
	for _, item := range items.itemsOrNil() {
		keys = append(keys, item.str("key"))
	}
	fault := sandboxFault(ex, account, keys, n)
	sb := kitSandbox{account: account}
	for i, key := range keys {
		if kitKeyFault(key) == nil {
			k.secrets.add(key, string(roles[min(i, n-1)]))
			sb.key = cmp.Or(sb.key, key)
		}
	}
	if account != "" {
		w.made = append(w.made, sb)
	}
	if fault != "" {
		k.warnings = append(k.warnings, "The server answered 201 to the kit's sandbox, but not with the world it asked for: "+fault+". The kit deletes what it made and judges what its keys can read.")
		return nil, false
	}
	return keys[:n], true
}

// itemsOrNil are an array's items; none for any other value.
func (v *jsonValue) itemsOrNil() []*jsonValue {
	if v == nil || v.typ != typeArray {
		return nil
	}
	return v.items
}

// sandboxFault is what keeps a 201 from being the sandbox the kit asked for, "" when nothing
// does.
func sandboxFault(ex *exchange, account string, keys []string, n int) string {
	switch {
	case ex.err != nil:
		return ex.err.Error()
	case account == "":
		return "its answer names no account"
	case len(account) > 255:
		return "its account is over 255 bytes"
	case len(keys) < n:
		return fmt.Sprintf("it holds %d keys, not the %d asked for", len(keys), n)
	}
	for i, key := range keys[:n] {
		if err := kitKeyFault(key); err != nil {
			return fmt.Sprintf("its key %d is refused: %v", i+1, err)
		}
	}
	return ""
}

// deleteBound is how long the kit gives the DELETE of each of its sandboxes, all sent at
// once: within the 5 s an interrupted run has to end; and deleteWait the longest it waits
// for a DELETE's turn, or after its 429, within it.
const (
	deleteBound = 4 * time.Second
	deleteWait  = time.Second
)

// deleteOwnSandboxes deletes the kit's sandboxes, all at once, each with a key of its own and
// within deleteBound whatever the run's context and -timeout say (an interrupt deletes them,
// then exits), and notes each it could not delete (its account, never its key).
func (k *kit) deleteOwnSandboxes() {
	if k.world == nil {
		return
	}
	failed := make([]string, len(k.world.made))
	var wg sync.WaitGroup
	for i, sb := range k.world.made {
		wg.Add(1)
		go func() { defer wg.Done(); failed[i] = k.deleteOwnSandbox(sb) }()
	}
	wg.Wait()
	for _, f := range failed {
		if f == "" {
			k.deleted++
			continue
		}
		k.cleanup = append(k.cleanup, f)
	}
	k.warnings = append(k.warnings, k.cleanup...)
	k.world.made = nil
}

// deleteOwnSandbox deletes one of the kit's sandboxes, and says why it did not, if it did not.
// It keeps the server's pace as every request does (its turn by RateLimit, a 429 waited out
// as Retry-After says), within deleteBound.
func (k *kit) deleteOwnSandbox(sb kitSandbox) string {
	account := cutField(sb.account, 64)
	if sb.key == "" {
		return "The kit's sandbox " + account + " was not deleted: the server's answer gave no key the kit can send. It is forgotten once idle."
	}
	ctx, cancel := context.WithTimeout(context.Background(), deleteBound)
	defer cancel()
	client := &http.Client{CheckRedirect: k.client.CheckRedirect, Transport: k.client.Transport} // bounded by ctx
	status := 0
	for try := 0; try < 4 && ctx.Err() == nil; try++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodDelete, k.base+"/test_helpers/sandboxes/"+url.PathEscape(sb.account), nil)
		if err != nil || req.URL.Host != k.host {
			return "The kit's sandbox " + account + " was not deleted: its account makes no request to the base URL's host."
		}
		req.Header.Set("Authorization", "Bearer "+sb.key)
		sleepCtx(ctx, min(time.Until(k.pace.turn(sb.key)), deleteWait)) // a turn far off is not waited for: the DELETE matters more
		k.requests.Add(1)
		res, err := client.Do(req)
		if err != nil {
			return fmt.Sprintf("The kit's sandbox %s was not deleted: its DELETE got no answer within %v (%v). It is forgotten once idle.", account, deleteBound, err)
		}
		io.Copy(io.Discard, io.LimitReader(res.Body, maxKitAnswer))
		res.Body.Close()
		if status = res.StatusCode; status != http.StatusTooManyRequests {
			break
		}
		sleepCtx(ctx, min(retryAfter(res.Header, time.Now()), deleteWait))
	}
	if status != http.StatusNoContent {
		return fmt.Sprintf("The kit's sandbox %s was not deleted: its DELETE answered %d, not 204. It is forgotten once idle.", account, status)
	}
	return ""
}

// sleepCtx waits d, or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// cleanupSummary says what became of the kit's sandboxes.
func (k *kit) cleanupSummary() string {
	switch {
	case len(k.cleanup) > 0:
		return fmt.Sprintf("%d of the kit's %d sandboxes were not deleted (above)", len(k.cleanup), len(k.cleanup)+k.deleted)
	case k.deleted > 0:
		return "the kit's sandboxes are deleted"
	}
	return "the kit made no sandbox"
}

// readWorld reads what the main key can read: the orders, at most maxKitPages pages of 100,
// the shipments they are linked to (at most 20), and those shipments' tracking numbers.
func (k *kit) readWorld(w *kitWorld) *kitWorld {
	w.own, w.numbers = false, map[string]string{}
	for _, p := range k.walk("?limit=100") {
		w.orders = append(w.orders, p.orders...)
	}
	holders := map[string]int{}
	for _, o := range w.orders {
		if o.ShipmentID == nil || len(*o.ShipmentID) > 255 || slices.Contains(w.shipments, *o.ShipmentID) || len(w.shipments) == 20 {
			continue
		}
		if w.linked[0] == "" {
			w.linked = [2]string{o.ID, *o.ShipmentID}
		}
		v := k.view(*o.ShipmentID)
		if v.ex.status != http.StatusOK || v.doc == nil {
			continue
		}
		w.shipments = append(w.shipments, *o.ShipmentID)
		if number := v.doc.strOrNull("tracking_number"); number != nil && len(*number) <= 255 {
			w.numbers[*number] = *o.ShipmentID
			holders[*number]++
		}
	}
	for number, n := range holders { // a number two shipments read hold is no one shipment's
		if n > 1 {
			delete(w.numbers, number)
		}
	}
	if n := len(w.orders); n >= 2 { // two listed orders' instants: the filter holds both
		w.to, w.from = w.orders[n/4].CreatedAt, w.orders[n-1-n/4].CreatedAt
	}
	return w
}

// ===== check: the catalogue, and a run of it =====

// ruleLevel is how binding a rule is: MUST, a sentence of the spec; SHOULD, a decision of
// the sandbox's contract where the spec says "not shown".
type ruleLevel string

const (
	levelMust   ruleLevel = "MUST"
	levelShould ruleLevel = "SHOULD"
)

// kitRule is one rule of the catalogue: its stable id (users name it in -rules, in -expect
// files and on dashboards), its level, its title, the words it rests on, and its judge.
type kitRule struct {
	id, title string
	level     ruleLevel
	adapter   ruleLevel // its level with -profile domain_adapter, when another
	spec      string    // the spec's words (MUST), or the contract's sentence (SHOULD)
	judge     func(k *kit) ruleResult
	every     bool // it judges the answers of the rules run, not requests of its own
	load      bool // it loads the server: -mode full only
}

// levelFor is the rule's level under the profile.
func (r *kitRule) levelFor(profile string) ruleLevel {
	if profile == "domain_adapter" && r.adapter != "" {
		return r.adapter
	}
	return r.level
}

// rulesNamed are the rules an id, or a prefix ending in *, names.
func rulesNamed(name string) []*kitRule {
	var named []*kitRule
	for i := range kitRules {
		r := &kitRules[i]
		if prefix, ok := strings.CutSuffix(name, "*"); ok && strings.HasPrefix(r.id, prefix) || r.id == name {
			named = append(named, r)
		}
	}
	return named
}

// The spec's sentences the rules rest on, where several rules quote one.
const (
	specKeys      = "Every request carries the header Authorization with an API key as a bearer credential: Authorization: Bearer <API_KEY>. A missing, invalid, expired or revoked key returns 401."
	specScopes    = "A key lacking the required scope returns 403. Scopes used: tracking:read (both tracking endpoints), orders:read (both order endpoints)."
	specPageSize  = "limit: Page size; default 20; maximum 100."
	specNormalize = "Events are persisted, normalized events only."
)

// kitRules is the catalogue, in the order reports list it: the rules the spec's sentences
// make (MUST), then those the sandbox's contract decides where the spec says "not shown"
// (SHOULD). The ids are stable; docs/conformance.md lists them (TestTheCatalogueIsOneTable).
var kitRules = []kitRule{
	{id: "auth.missing_key", level: levelMust, title: "no key: 401 on each of the four operations", judge: judgeMissingKey, spec: specKeys},
	{id: "auth.invalid_key", level: levelMust, title: "an unknown key: 401 on each of the four operations", judge: judgeRefusedKey(roleNone, "invalid_api_key"), spec: specKeys},
	{id: "auth.expired_key", level: levelMust, title: "an expired key: 401 on each of the four operations", judge: judgeRefusedKey(roleExpired, "expired_api_key"), spec: specKeys},
	{id: "auth.revoked_key", level: levelMust, title: "a revoked key: 401 on each of the four operations", judge: judgeRefusedKey(roleRevoked, "revoked_api_key"), spec: specKeys},
	{id: "auth.scope_tracking", level: levelMust, title: "a key without tracking:read: 403 on both tracking operations", judge: judgeScope(roleOrders, 0, 2), spec: specScopes},
	{id: "auth.scope_orders", level: levelMust, title: "a key without orders:read: 403 on both order operations", judge: judgeScope(roleTracking, 2, 4), spec: specScopes},
	{id: "auth.other_account", level: levelMust, title: "another account's key reading this account's order, shipment and tracking number: 404 each (or that account's own)", judge: judgeOtherAccount,
		spec: "Keys and scopes are tied to an account and an environment; resources of another account or environment are reported as 404."},
	{id: "tracking.view_fields", level: levelMust, title: "the view's five fields and each event's four, with their types, each once; in the kit's world, the shipment's as sent", judge: judgeViewFields,
		spec: "shipment_id, reference, tracking_number (string or null), status, events: required; each event's status, description, timestamp, and location: \"Display location; empty string when none\"."},
	{id: "tracking.events", level: levelMust, title: "only persisted, normalized events: in the kit's world, exactly the events sent, as normalized", judge: judgeEvents, spec: specNormalize},
	{id: "tracking.utc", level: levelMust, title: "every timestamp ISO 8601 in UTC with the suffix Z", judge: judgeUTC,
		spec: "All timestamps are ISO 8601 with timezone. Responses use UTC with the suffix Z."},
	{id: "tracking.by_number", level: levelMust, title: "a number one shipment holds finds the same view as its id", judge: judgeByNumber,
		spec: "Lookup is account-scoped and matches the primary tracking number only. Response 200: the tracking view of a shipment (same shape as above)."},
	{id: "tracking.exact_lookup", level: levelMust, title: "a shipment id or a tracking number in another case: 404", judge: judgeExactLookup,
		spec: "Path parameter tracking_number (required, string): exact tracking number. Unknown shipment in this account and environment: 404."},
	{id: "tracking.primary_number_only", level: levelMust, title: "a further parcel's number: 404", judge: judgePrimaryNumberOnly,
		spec: "Lookup is account-scoped and matches the primary tracking number only."},
	{id: "tracking.unknown", level: levelMust, title: "an unknown shipment id and an unknown number: 404", judge: judgeTrackingUnknown,
		spec: "Unknown shipment in this account and environment: 404. Unknown number: 404 in both the sandbox and the unreleased domain adapter."},
	{id: "tracking.ambiguous_number", level: levelMust, title: "a number two shipments hold: 404 (409 with -profile domain_adapter)", judge: judgeAmbiguousNumber,
		spec: "Ambiguous number: the local sandbox returns 404; the unreleased domain adapter returns 409."},
	{id: "tracking.dedup", level: levelMust, title: "no two events of one instant and description; in the kit's world, its duplicate shown once, the first sent", judge: judgeDedup,
		spec: "Events with equivalent instants and descriptions are deduplicated; duplicates are suppressed."},
	{id: "tracking.no_offset", level: levelMust, title: "an event sent without an offset is not shown", judge: judgeNoOffset,
		spec: "Input timestamps without timezone are not interpreted (not assumed to be UTC); such events are excluded."},
	{id: "tracking.utc_across_dst", level: levelMust, title: "events sent across a UK daylight-saving change shown at their instants in UTC (suffix Z), in order", judge: judgeUTCAcrossDST,
		spec: "UTC instants are preserved across UK daylight-saving changes."},
	{id: "orders.fields", level: levelMust, title: "the six fields with their types, each once, created_at in UTC, a platform of the five, no marketplace data; in the kit's world, each order as sent", judge: judgeOrderFields,
		spec: "id, merchant_reference, platform (one of five marketplace platform identifiers), status, shipment_id (string or null), created_at (ISO 8601, UTC Z). Marketplace tokens and raw marketplace data are never part of the resource."},
	{id: "orders.retrieve", level: levelMust, title: "an order read by id equals the listed one (in the kit's world, one of each status, as sent)", judge: judgeRetrieve,
		spec: "Response 200: one imported order."},
	{id: "orders.unknown", level: levelMust, title: "an unknown order: 404", judge: judgeOrderUnknown,
		spec: "Unknown order in this account and environment: 404."},
	{id: "orders.exact_id", level: levelMust, title: "an order id in another case: 404", judge: judgeOrderExactID,
		spec: "Resource IDs are strings, scoped to the account and the environment. Unknown order in this account and environment: 404."},
	{id: "orders.default_limit", level: levelMust, title: "limit 20 when none is sent: at most 20 orders, 20 when more exist", judge: judgeDefaultLimit, spec: specPageSize},
	{id: "orders.max_limit", level: levelMust, title: "limit=100: at most 100 orders, 100 when more exist; limit=101 never more than 100", judge: judgeMaxLimit, spec: specPageSize},
	{id: "orders.pagination", level: levelMust, title: "limit at least 1; has_more false exactly when next_cursor is null", judge: judgePagination,
		spec: "limit: integer (minimum 1). next_cursor: Opaque signed cursor for the next page; null when none. has_more: Whether more results follow."},
	{id: "orders.cursor_walk", level: levelMust, title: "following next_cursor shows each order once; in the kit's world, every order sent", judge: judgeCursorWalk,
		spec: "cursor: Opaque signed next_cursor from a previous page; the same filters must be kept between pages."},
	{id: "orders.malformed_cursor", level: levelMust, title: "a malformed cursor: 400", judge: judgeMalformedCursor, spec: "Malformed cursor: 400."},
	{id: "orders.filter_status", level: levelMust, title: "status: only orders of that status; in the kit's world, every one sent", judge: judgeFilterStatus,
		spec: "status: Exact match on normalized status."},
	{id: "orders.filter_created", level: levelMust, title: "created_from and created_to inclusive: the orders at exactly those instants included, none outside", judge: judgeFilterCreated,
		spec: "created_from: Inclusive lower bound on creation time. created_to: Inclusive upper bound on creation time."},
	{id: "orders.linked_shipment", level: levelMust, title: "an order's shipment_id finds that shipment's tracking view", judge: judgeLinkedShipment,
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
	{id: "http.unique_members", level: levelShould, title: "no JSON answer names a member twice", judge: judgeUniqueMembers, every: true,
		spec: "Every response: JSON bodies compact UTF-8 (RFC 8259: the names within an object SHOULD be unique; a name given twice is read differently by different clients)."},
	{id: "errors.problem_json", level: levelShould, title: "every error application/problem+json with type, title, status, detail, code and request_id", judge: judgeProblemJSON, every: true,
		spec: "Every error body is RFC 9457 problem details, Content-Type: application/problem+json, with the code and the request id."},
	{id: "errors.codes", level: levelShould, title: "each error the kit made has its documented code", judge: judgeCodes, every: true,
		spec: "401 missing_api_key, invalid_api_key, expired_api_key, revoked_api_key; 403 insufficient_scope; 404 not_found; 405 method_not_allowed; 413 body_too_large; 400 invalid_cursor; 422 invalid_parameter; 409 ambiguous_tracking_number (the domain adapter)."},
	{id: "orders.order", level: levelShould, title: "newest first: created_at, then id, descending", judge: judgeOrderOrder,
		spec: "Order: newest first, created_at descending, then id descending."},
	{id: "orders.limit_range", level: levelShould, title: "limit 0 and 101: 422 invalid_parameter limit", judge: judgeLimitRange,
		spec: "limit: integer 1..100; a bad value (limit 0, 101): 422 invalid_parameter, naming the parameter in param."},
	{id: "orders.cursor_filters", level: levelShould, title: "a cursor sent with another status, created_from or created_to: 400 invalid_cursor", judge: judgeCursorFilters,
		spec: "A cursor that does not decode, is not signed by this server, belongs to another account/environment or is used with other filters: 400 invalid_cursor."},
	{id: "http.request_id", level: levelShould, title: "a Request-Id on every answer", judge: judgeRequestID, every: true,
		spec: "Every response: Request-Id header (req_ + random)."},
	{id: "http.no_store", level: levelShould, title: "Cache-Control: no-store on every answer", judge: judgeNoStore, every: true,
		spec: "Every response: Cache-Control: no-store on /v1 responses."},
	{id: "limits.rate_limit_headers", level: levelShould, title: "RateLimit-Policy and RateLimit, well formed, on every answer past the key check; Retry-After on the 429", judge: judgeRateLimitHeaders, load: true, every: true,
		spec: "While a rate limit is set, answers that passed the rate limiter (and 429s) carry its state in the IETF draft's structured fields; 429 rate_limited with Retry-After in whole seconds."},
	{id: "tracking.status", level: levelShould, title: "a view's status is its last event's (pre_transit without one)", judge: judgeViewStatus,
		spec: "The shipment status is the status of its last shown event, or pre_transit when none."},
	{id: "tracking.vocabulary", level: levelShould, title: "every status shown is of the tracking vocabulary; in the kit's world, each of the nine is shown", judge: judgeTrackingVocabulary,
		spec: "Tracking status (shipment status, events[].status): pre_transit, in_transit, out_for_delivery, available_for_pickup, delivered, return_to_sender, failure, cancelled, unknown."},
	{id: "tracking.events_oldest_first", level: levelShould, title: "events oldest first, those of one instant in the order sent", judge: judgeEventsOldestFirst,
		spec: "Events are ordered oldest first (stable for equal instants)."},
	{id: "orders.vocabulary", level: levelShould, title: "every order status shown is of the vocabulary; in the kit's world, each of the four is shown", judge: judgeOrderVocabulary,
		spec: "Order status: unfulfilled, partially_fulfilled, fulfilled, cancelled."},
}

// plan is the rules a run judges, in the order it judges them: the selected rules that send
// requests of their own, in the catalogue's order, those that load the server last; then
// the selected rules that judge every answer. Selected alone, these judge every rule's
// answers, and the others are run (not reported) for them.
func (k *kit) plan() (run []*kitRule, reported map[string]bool) {
	reported = map[string]bool{}
	for _, name := range k.cfg.rules {
		for _, r := range rulesNamed(name) {
			reported[r.id] = true
		}
	}
	onlyEvery := len(reported) > 0
	for id := range reported {
		onlyEvery = onlyEvery && rulesNamed(id)[0].every
	}
	for _, pass := range []int{0, 1, 2} { // their own requests, then those that load the server, then every answer
		for i := range kitRules {
			r := &kitRules[i]
			stage := 0
			switch {
			case r.every:
				stage = 2
			case r.load:
				stage = 1
			}
			if stage == pass && (len(reported) == 0 || reported[r.id] || onlyEvery && !r.every) {
				run = append(run, r)
			}
		}
	}
	if len(reported) == 0 {
		for _, r := range run {
			reported[r.id] = true
		}
	}
	return run, reported
}

// run judges the planned rules, after the first read and the world; it deletes the kit's
// sandboxes before it returns, whatever happened. It ends early when the run is interrupted
// or the server refuses its pace.
func (k *kit) run() (*checkReport, error) {
	defer k.release()
	plan, reported := k.plan()
	err := k.firstRead()
	results := map[string]ruleResult{}
	if err == nil {
		k.rule = "(world)"
		k.world = k.makeWorld()
		for _, r := range plan {
			if k.ctx.Err() != nil {
				break
			}
			if results[r.id] = k.judgeRule(r, reported); context.Cause(k.ctx) == errTimeUp {
				delete(results, r.id) // cut short: not judged
			}
		}
	}
	k.deleteOwnSandboxes()
	cause := context.Cause(k.ctx)
	if err == nil && cause == errTimeUp { // the rules not judged are skipped, saying why
		for _, r := range plan {
			if _, judged := results[r.id]; !judged {
				results[r.id] = skip(errTimeUp.Error())
			}
		}
		cause = nil
	}
	if err == nil && cause != nil {
		err = cause
	}
	if err != nil {
		return nil, err
	}
	return k.report(results, reported), nil
}

// errTimeUp ends a run whose caller gave it until a time (the MCP door's check_server, which
// answers before the listener's write timeout): the rules not judged by then are skipped.
var errTimeUp = errors.New("not judged: the call's time ran out (check_server answers within the listener's write timeout); check fewer rules at once, or run go run . check")

// judgeRule judges one rule: one that loads the server only in full mode; one that judges
// every answer, the answers of the rules reported (or of every rule run).
func (k *kit) judgeRule(r *kitRule, reported map[string]bool) ruleResult {
	if r.load && !k.cfg.full {
		return skip("it loads the server: run with -mode full")
	}
	if r.every {
		k.judged = k.judged[:0]
		onlyEvery := !slices.ContainsFunc(kitRules, func(o kitRule) bool { return reported[o.id] && !o.every })
		for _, other := range kitRules {
			if !other.every && (onlyEvery || reported[other.id]) {
				k.judged = append(k.judged, k.used[other.id]...)
			}
		}
	}
	k.rule = r.id
	k.cut.Store(nil)
	v := r.judge(k)
	if ex := k.cut.Load(); ex != nil {
		v = ruleResult{}
		v.fail(k, ex, fmt.Sprintf("an answer within -timeout %v", k.cfg.timeout), "")
		v.evidence[0].Seen += "; the rule ends at this request, and sent nothing more"
	}
	return v.settled()
}

// firstRead makes the kit's first request, GET {base}/orders?limit=1 with -key: a server it
// cannot reach, or whose answer says the key is refused or this is not the API, cannot be
// judged (exit status 2). A 429 is waited out.
func (k *kit) firstRead() error {
	k.rule = "(first read)"
	ex := k.get(roleMain, "/orders?limit=1", http.StatusOK, "")
	target := k.base + "/orders?limit=1"
	doc, jsonErr := readJSON(ex.body)
	switch {
	case k.ctx.Err() != nil:
		return context.Cause(k.ctx)
	case ex.status == 0:
		return fmt.Errorf("the base URL %s cannot be reached, or does not answer HTTP within -timeout %v: %v", k.base, k.cfg.timeout, ex.err)
	case ex.status == http.StatusUnauthorized:
		return fmt.Errorf("the first read, GET %s with -key, answered 401: the key is refused (unknown, expired or revoked; a test key of this server is needed)", target)
	case ex.status == http.StatusForbidden:
		return fmt.Errorf("the first read, GET %s with -key, answered 403: the key lacks a scope (-key needs tracking:read and orders:read)", target)
	case ex.status == http.StatusTooManyRequests:
		return fmt.Errorf("%w: the first read, GET %s, was still answered 429 after three retries", errPaceRefused, target)
	case ex.status == http.StatusNotFound && !strings.HasSuffix(k.base, "/v1"):
		return fmt.Errorf("the first read, GET %s, answered 404: is /v1 missing from the base URL? The API's base ends in /v1 (such as http://127.0.0.1:8080/v1), unless the server serves its paths elsewhere", target)
	case ex.status == http.StatusNotFound:
		return fmt.Errorf("the first read, GET %s, answered 404: this is not the API (the base URL is the API's)", target)
	case jsonErr != nil || doc.typ != typeObject:
		return fmt.Errorf("the first read, GET %s, answered %d with a body that is not a JSON object: this is not the API", target, ex.status)
	}
	return nil
}

// ===== check: the catalogue's judges of auth.* =====

// operationTargets are a request of each of the four operations: the shipment's tracking, a
// number, the list, an order; naming what the kit's own world holds, else ids no server
// holds (so that a request of a wrong method touches nothing).
func (k *kit) operationTargets() []string {
	shipment, number, order := unknownShipment, unknownNumber, unknownOrder
	if w := k.world; w.own {
		shipment, number, order = kitShipments[0].id, kitShipments[0].number, w.orders[0].ID
	}
	return []string{"/shipments/" + url.PathEscape(shipment) + "/tracking", "/tracking/" + url.PathEscape(number), "/orders", "/orders/" + url.PathEscape(order)}
}

func judgeMissingKey(k *kit) ruleResult {
	var r ruleResult
	for _, target := range k.operationTargets() {
		r.wantStatus(k, k.get(roleNone, target, http.StatusUnauthorized, "missing_api_key"), http.StatusUnauthorized, "no Authorization")
	}
	return r
}

// judgeRefusedKey is a rule that role's key (roleNone: a key no account holds) is 401 code
// on each of the four operations.
func judgeRefusedKey(role kitRole, code string) func(k *kit) ruleResult {
	what := "a key no account holds"
	if role != roleNone {
		what = "a key that is " + strings.TrimSuffix(code, "_api_key")
	}
	return func(k *kit) ruleResult {
		if role != roleNone && k.keys[role] == "" {
			return skip("needs " + flagOf(role))
		}
		var r ruleResult
		for _, target := range k.operationTargets() {
			req := kitRequest{method: http.MethodGet, target: target, role: role, status: http.StatusUnauthorized, code: code}
			if role == roleNone {
				req.unknownKey = unknownKey
			}
			r.wantStatus(k, k.send(req), http.StatusUnauthorized, what)
		}
		return r
	}
}

// judgeScope is a rule that role's key, holding the other scope only, is 403 on the
// operations from..to of operationTargets.
func judgeScope(role kitRole, from, to int) func(k *kit) ruleResult {
	return func(k *kit) ruleResult {
		if k.keys[role] == "" {
			return skip("needs " + flagOf(role) + " (a key with only the other scope)")
		}
		var r ruleResult
		for _, target := range k.operationTargets()[from:to] {
			r.wantStatus(k, k.get(role, target, http.StatusForbidden, "insufficient_scope"), http.StatusForbidden, "a key without the operation's scope")
		}
		return r
	}
}

// judgeOtherAccount: the other account's key reads this account's order, shipment and number
// as 404. Ids and numbers are scoped to an account, so the other may hold one of them too: a
// 200 with its own is not the fault; a 200 with this account's is.
func judgeOtherAccount(k *kit) ruleResult {
	if k.keys[roleAlt] == "" {
		return skip("needs -alt-key (a key of another account)")
	}
	w := k.world
	var targets []string
	if len(w.orders) > 0 {
		targets = append(targets, "/orders/"+url.PathEscape(w.orders[0].ID))
	}
	if len(w.shipments) > 0 {
		targets = append(targets, "/shipments/"+url.PathEscape(w.shipments[0])+"/tracking")
	}
	if numbers := slices.Sorted(maps.Keys(w.numbers)); len(numbers) > 0 {
		targets = append(targets, "/tracking/"+url.PathEscape(numbers[0]))
	}
	if len(targets) == 0 {
		return skip("the key reads nothing of its account for the other account's key to read")
	}
	var r ruleResult
	for _, target := range targets {
		ours, theirs := k.get(roleMain, target, http.StatusOK, ""), k.get(roleAlt, target, http.StatusNotFound, "not_found")
		mine, _ := readJSON(ours.body)
		seen, _ := readJSON(theirs.body)
		switch {
		case theirs.status == http.StatusNotFound && theirs.err == nil:
		case theirs.status == http.StatusOK && ours.status == http.StatusOK && mine.equal(seen):
			r.fail(k, theirs, "404, or the other account's own resource of that id or number", "this account's resource, as its own key reads it")
		case theirs.status != http.StatusOK:
			r.wantStatus(k, theirs, http.StatusNotFound, "another account's resource")
		}
	}
	return r
}

// ===== check: the catalogue's judges of tracking.* =====

// kitView is a tracking view as the kit reads it: the answer, its JSON (nil for an answer
// other than 200 with a JSON object), and its events, each read as far as it goes.
type kitView struct {
	ex     *exchange
	doc    *jsonValue
	events []kitSeenEvent
}

// kitSeenEvent is an event of a view as the kit reads it: its members' strings ("" for any
// other value), and its instant when its timestamp is RFC 3339.
type kitSeenEvent struct {
	status, description, timestamp, location string
	at                                       time.Time
	timed                                    bool
}

// The members of a view and of an event, with their types.
var (
	viewMembers  = []kitMember{{"shipment_id", typeString}, {"reference", typeString}, {"tracking_number", typeStringOrNull}, {"status", typeString}, {"events", typeArray}}
	eventMembers = []kitMember{{"status", typeString}, {"description", typeString}, {"timestamp", typeString}, {"location", typeString}}
)

// utcTimestamp is a timestamp written in UTC with the suffix Z.
var utcTimestamp = regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?Z$`)

// view is the tracking view of the shipment id, read with the main key.
func (k *kit) view(id string) *kitView {
	return readView(k.get(roleMain, "/shipments/"+url.PathEscape(id)+"/tracking", http.StatusOK, ""))
}

func readView(ex *exchange) *kitView {
	v := &kitView{ex: ex}
	if ex.status != http.StatusOK || ex.err != nil {
		return v
	}
	doc, err := readJSON(ex.body)
	if err != nil || doc.typ != typeObject {
		return v
	}
	v.doc = doc
	events, _ := doc.member("events")
	for _, e := range events.itemsOrNil() {
		se := kitSeenEvent{status: e.str("status"), description: e.str("description"), timestamp: e.str("timestamp"), location: e.str("location")}
		at, err := time.Parse(time.RFC3339Nano, se.timestamp)
		se.at, se.timed = at, err == nil
		v.events = append(v.events, se)
	}
	return v
}

// answerFault says why ex is not a readable 200.
func answerFault(ex *exchange) string {
	switch {
	case ex.status == 0:
		return "no answer"
	case ex.status != http.StatusOK:
		return fmt.Sprintf("status %d", ex.status)
	case ex.err != nil:
		return ex.err.Error()
	}
	return "a body that is not one JSON object"
}

// Why a tracking rule cannot be judged.
const (
	noShipments  = "no shipment known: the orders the key reads are linked to none (a server that makes sandboxes gets the kit's own)"
	noViews      = "no tracking view the kit knows answered 200 with a JSON object (see tracking.view_fields)"
	ownWorldOnly = "needs the kit's own world (records it sends to a server that makes sandboxes): the evidence cannot be discovered"
)

// judgeViews is a rule judged on each tracking view the kit knows, read with the main key,
// beside what the kit sent of it (nil without its own world): fault says what is wrong with
// one ("" when nothing is), which the rule expected not to be. A view that does not read
// fails the rule when unread says so; else it is left to tracking.view_fields, and a rule that
// reads none is a skip.
func judgeViews(expected string, unread bool, fault func(v *kitView, sent *kitShipment) string) func(k *kit) ruleResult {
	return func(k *kit) ruleResult {
		if len(k.world.shipments) == 0 {
			return skip(noShipments)
		}
		var r ruleResult
		read := 0
		for _, id := range k.world.shipments {
			v := k.view(id)
			switch {
			case v.doc == nil && unread:
				r.fail(k, v.ex, expected, answerFault(v.ex))
			case v.doc == nil:
			default:
				read++
				if f := fault(v, k.world.sent[id]); f != "" {
					r.fail(k, v.ex, expected, f)
				}
			}
		}
		if read == 0 && !unread {
			return skip(noViews)
		}
		return r
	}
}

// ownViews is a rule judged, in the kit's own world only, on the views of its shipments.
func ownViews(expected string, fault func(v *kitView, sent *kitShipment) string) func(k *kit) ruleResult {
	judge := judgeViews(expected, true, fault)
	return func(k *kit) ruleResult {
		if !k.world.own {
			return skip(ownWorldOnly)
		}
		return judge(k)
	}
}

var (
	judgeViewFields = judgeViews("the view's five members and each event's four, with their types, each once; in the kit's world, its shipment_id, reference and tracking_number as sent", true, viewFieldsFault)
	judgeEvents     = ownViews("exactly the events the kit sent, each at its instant with its status, description and location, less those the spec's normalization leaves out", eventsFault)
	judgeUTC        = judgeViews("every timestamp ISO 8601 in UTC, with the suffix Z", false, func(v *kitView, _ *kitShipment) string {
		for i, e := range v.events {
			if !utcTimestamp.MatchString(e.timestamp) {
				return fmt.Sprintf("events[%d].timestamp %q", i, cutField(e.timestamp, 64))
			}
		}
		return ""
	})
	judgeDedup               = judgeViews("no two events of one instant and description; in the kit's world, the event it sent twice shown once, the first sent", false, dedupFault)
	judgeNoOffset            = ownViews("the events sent without an offset not shown, the others shown", noOffsetFault)
	judgeTrackingExactFields = judgeViews("the view's five members and each event's four, none beyond", false, exactViewFault)
	judgeViewStatus          = judgeViews("the view's status that of its last event, pre_transit without one; in the kit's world, the status of its last event sent", false, viewStatusFault)
	judgeEventsOldestFirst   = judgeViews("events oldest first; in the kit's world, those of one instant in the order sent", false, oldestFirstFault)
)

func viewFieldsFault(v *kitView, sent *kitShipment) string {
	if f := shapeFault(v.doc, viewMembers, ""); f != "" {
		return f
	}
	events, _ := v.doc.member("events")
	for i, e := range events.items {
		if f := shapeFault(e, eventMembers, fmt.Sprintf("events[%d].", i)); f != "" {
			return f
		}
	}
	if sent == nil {
		return ""
	}
	number := v.doc.strOrNull("tracking_number")
	switch {
	case v.doc.str("shipment_id") != sent.id:
		return fmt.Sprintf("shipment_id %q, sent %q", cutField(v.doc.str("shipment_id"), 64), sent.id)
	case v.doc.str("reference") != sent.reference:
		return fmt.Sprintf("reference %q, sent %q", cutField(v.doc.str("reference"), 64), sent.reference)
	case (number == nil) != (sent.number == "") || number != nil && *number != sent.number:
		want := (*string)(nil)
		if sent.number != "" {
			want = &sent.number
		}
		return fmt.Sprintf("tracking_number %s, sent %s", quotedOrNull(number), quotedOrNull(want))
	}
	return ""
}

// quotedOrNull is a string or null member as JSON writes it, cut for evidence.
func quotedOrNull(s *string) string {
	if s == nil {
		return "null"
	}
	return strconv.Quote(cutField(*s, 64))
}

// eventsFault is what of v's events is not what the kit sent, as normalized: an event it
// did not send, one it sent missing, or one whose status or location differs.
func eventsFault(v *kitView, sent *kitShipment) string {
	want := sent.shown()
	matched := make([]bool, len(want))
	for i, e := range v.events {
		j := slices.IndexFunc(want, func(w kitEvent) bool { return sameEvent(e, w) })
		for j >= 0 && matched[j] {
			next := slices.IndexFunc(want[j+1:], func(w kitEvent) bool { return sameEvent(e, w) })
			if next < 0 {
				j = -1
				break
			}
			j += 1 + next
		}
		if j < 0 {
			return fmt.Sprintf("events[%d], %q at %q, is not an event the kit sent (or one the spec's normalization shows)", i, cutField(e.description, 64), cutField(e.timestamp, 64))
		}
		matched[j] = true
		if e.status != want[j].status || e.location != want[j].location {
			return fmt.Sprintf("events[%d], %q: status %q and location %q, sent %q and %q", i, want[j].description, cutField(e.status, 64), cutField(e.location, 64), want[j].status, want[j].location)
		}
	}
	if j := slices.Index(matched, false); j >= 0 {
		return fmt.Sprintf("the event sent at %s, %q, is not shown", want[j].sent, want[j].description)
	}
	return ""
}

// sameEvent reports whether a seen event is w: the same instant and description.
func sameEvent(e kitSeenEvent, w kitEvent) bool {
	at, _ := time.Parse(time.RFC3339, w.shown)
	return e.timed && e.at.Equal(at) && e.description == w.description
}

// eventsAt are the indexes of v's events of description at the instant at, in any offset.
func eventsAt(v *kitView, at time.Time, description string) []int {
	var found []int
	for i, e := range v.events {
		if e.timed && e.at.Equal(at) && e.description == description {
			found = append(found, i)
		}
	}
	return found
}

// dedupFault: no two events of one instant and description; of each event the kit sent
// twice (a second with an offset at an instant and description it sent before), the one
// shown, located as the first sent.
func dedupFault(v *kitView, sent *kitShipment) string {
	seen := map[string]bool{}
	for i, e := range v.events {
		id := e.at.UTC().Format(time.RFC3339Nano) + " " + e.description
		if e.timed && seen[id] {
			return fmt.Sprintf("events[%d] repeats %q at %s", i, cutField(e.description, 64), cutField(e.timestamp, 64))
		}
		seen[id] = true
	}
	if sent == nil {
		return ""
	}
	for i, e := range sent.events {
		at, err := time.Parse(time.RFC3339, e.sent)
		if e.shown != "" || err != nil { // shown, or sent without an offset
			continue
		}
		f := slices.IndexFunc(sent.events[:i], func(f kitEvent) bool { return f.description == e.description && f.shown != "" })
		if f < 0 {
			continue
		}
		first, found := sent.events[f], eventsAt(v, at, e.description)
		if len(found) != 1 || v.events[found[0]].location != first.location {
			return fmt.Sprintf("%q sent twice at %s: %d such events shown, want one, located %q as the first sent", e.description, first.shown, len(found), first.location)
		}
	}
	return ""
}

// noOffsetFault: of a shipment the kit sent an event without an offset, that event is not
// shown, at any instant, and the events sent with one are.
func noOffsetFault(v *kitView, sent *kitShipment) string {
	if !slices.ContainsFunc(sent.events, func(e kitEvent) bool { _, err := time.Parse(time.RFC3339, e.sent); return err != nil }) {
		return ""
	}
	for _, e := range sent.events {
		if _, err := time.Parse(time.RFC3339, e.sent); err == nil {
			continue
		}
		for i, seen := range v.events {
			if seen.description == e.description {
				return fmt.Sprintf("events[%d], %q, sent at %s without an offset, is shown at %q", i, e.description, e.sent, cutField(seen.timestamp, 64))
			}
		}
	}
	for _, e := range sent.shown() {
		if at, _ := time.Parse(time.RFC3339, e.shown); len(eventsAt(v, at, e.description)) == 0 {
			return fmt.Sprintf("%q, sent with an offset at %s, is not shown", e.description, e.sent)
		}
	}
	return ""
}

// kitDSTShipment is the shipment whose events the kit sends across the UK's change to
// summer time.
const kitDSTShipment = "shp_ck_dst"

// judgeUTCAcrossDST: each event sent across the change is shown at its instant, written in
// UTC with the suffix Z, and in the order of the instants.
var judgeUTCAcrossDST = ownViews("each event sent across the UK's change to summer time shown at its instant in UTC (suffix Z), in the order of the instants", func(v *kitView, sent *kitShipment) string {
	if sent.id != kitDSTShipment {
		return ""
	}
	last := -1
	for _, e := range sent.shown() {
		i := slices.IndexFunc(v.events, func(s kitSeenEvent) bool { return s.description == e.description })
		switch {
		case i < 0:
			return fmt.Sprintf("%q, sent at %s, not shown", e.description, e.sent)
		case !utcTimestamp.MatchString(v.events[i].timestamp) || !v.events[i].timed || !v.events[i].at.Equal(mustInstant(e.shown)):
			return fmt.Sprintf("%q, sent at %s, shown at %q, not %s", e.description, e.sent, cutField(v.events[i].timestamp, 64), e.shown)
		case i < last:
			return fmt.Sprintf("%q shown before the event it follows", e.description)
		}
		last = i
	}
	return ""
})

// mustInstant is an instant of the kit's own tables.
func mustInstant(s string) time.Time {
	at, _ := time.Parse(time.RFC3339, s)
	return at
}

func exactViewFault(v *kitView, _ *kitShipment) string {
	if f := memberBeyond(v.doc, viewMembers, ""); f != "" {
		return f
	}
	events, _ := v.doc.member("events")
	for i, e := range events.itemsOrNil() {
		if f := memberBeyond(e, eventMembers, fmt.Sprintf("events[%d].", i)); f != "" {
			return f
		}
	}
	return ""
}

func viewStatusFault(v *kitView, sent *kitShipment) string {
	status, want := v.doc.str("status"), trackingStatuses[0]
	if n := len(v.events); n > 0 {
		want = v.events[n-1].status
	}
	switch {
	case status != want:
		return fmt.Sprintf("status %q; its last event's %q", cutField(status, 64), cutField(want, 64))
	case sent != nil && status != sent.status:
		return fmt.Sprintf("status %q; the status of the last event sent %q", cutField(status, 64), sent.status)
	}
	return ""
}

// oldestFirstFault: each event at or after the one above it; in the kit's world, the events
// it sent in the order of its table's normalization (oldest first, stable for one instant).
func oldestFirstFault(v *kitView, sent *kitShipment) string {
	for i := 1; i < len(v.events); i++ {
		if a, b := v.events[i-1], v.events[i]; a.timed && b.timed && b.at.Before(a.at) {
			return fmt.Sprintf("events[%d] at %s, before the one above it", i, cutField(b.timestamp, 64))
		}
	}
	if sent == nil {
		return ""
	}
	want, last := sent.shown(), -1
	for i, e := range v.events {
		j := slices.IndexFunc(want, func(w kitEvent) bool { return sameEvent(e, w) })
		if j >= 0 && j < last {
			return fmt.Sprintf("events[%d], %q, shown before %q, which was sent before it at its instant", i, cutField(e.description, 64), want[last].description)
		}
		last = max(last, j)
	}
	return ""
}

// judgeTrackingVocabulary: every status a view shows is of the vocabulary; in the kit's
// world, each of the vocabulary is shown by some view.
func judgeTrackingVocabulary(k *kit) ruleResult {
	shown := map[string]bool{}
	r := judgeViews("a status of "+strings.Join(trackingStatuses, ", "), false, func(v *kitView, _ *kitShipment) string {
		statuses := []string{v.doc.str("status")}
		for _, e := range v.events {
			statuses = append(statuses, e.status)
		}
		for _, s := range statuses {
			if !slices.Contains(trackingStatuses, s) {
				return fmt.Sprintf("status %q", cutField(s, 64))
			}
			shown[s] = true
		}
		return ""
	})(k)
	if k.world.own && r.result != "skip" {
		for _, s := range trackingStatuses {
			if !shown[s] {
				r.fail(k, k.view(kitShipments[0].id).ex, "each tracking status shown by some view of the kit's shipments, which were sent all nine", "no view shows "+s)
			}
		}
	}
	return r
}

func judgeByNumber(k *kit) ruleResult {
	if len(k.world.numbers) == 0 {
		return skip("no tracking number known that one shipment holds")
	}
	var r ruleResult
	missing := []*exchange{}
	for _, number := range slices.Sorted(maps.Keys(k.world.numbers)) {
		id := k.world.numbers[number]
		byID, byNumber := k.view(id), readView(k.get(roleMain, "/tracking/"+url.PathEscape(number), http.StatusOK, ""))
		if !k.world.own && (byNumber.ex.status == http.StatusNotFound || byNumber.ex.status == http.StatusConflict) {
			missing = append(missing, byNumber.ex) // another shipment, not read, may hold it
			continue
		}
		switch {
		case !r.wantStatus(k, byNumber.ex, http.StatusOK, "the view of the one shipment that holds the number"):
		case byNumber.doc == nil || byID.doc == nil || !byID.doc.equal(byNumber.doc):
			r.fail(k, byNumber.ex, "the same view as GET /shipments/"+id+"/tracking", "another view")
		}
	}
	if len(missing) == len(k.world.numbers) {
		r.fail(k, missing[0], "a number one shipment holds found by GET /tracking/{number}", fmt.Sprintf("every one of the %d numbers of the shipments read answered 404 or 409: another shipment may hold one, but not every one", len(missing)))
	}
	return r
}

// swapCase is s with its letters' case swapped: the same id, or number, in another case.
func swapCase(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsUpper(r) {
			return unicode.ToLower(r)
		}
		return unicode.ToUpper(r)
	}, s)
}

// wantNotOther fails r unless ex, the lookup of alias (the same text as a known id or
// number, in another case), is 404, or finds what holds alias itself (member of its answer).
func wantNotOther(k *kit, r *ruleResult, ex *exchange, member, alias string) {
	doc, _ := readJSON(ex.body)
	if ex.status == http.StatusOK && doc.str(member) == alias && alias != "" {
		return // the server holds that other id itself
	}
	r.wantStatus(k, ex, http.StatusNotFound, "an id or number matched exactly: another case is another one")
}

func judgeExactLookup(k *kit) ruleResult {
	w := k.world
	numbers := slices.Sorted(maps.Keys(w.numbers))
	if len(w.shipments) == 0 || len(numbers) == 0 || swapCase(w.shipments[0]) == w.shipments[0] || swapCase(numbers[0]) == numbers[0] {
		return skip("no shipment id and number known with a letter whose case can change")
	}
	var r ruleResult
	id, number := swapCase(w.shipments[0]), swapCase(numbers[0])
	wantNotOther(k, &r, k.get(roleMain, "/shipments/"+url.PathEscape(id)+"/tracking", http.StatusNotFound, "not_found"), "shipment_id", id)
	ex := k.get(roleMain, "/tracking/"+url.PathEscape(number), http.StatusNotFound, "not_found")
	wantNotOther(k, &r, ex, "tracking_number", number)
	return r
}

func judgePrimaryNumberOnly(k *kit) ruleResult {
	if !k.world.own {
		return skip(ownWorldOnly)
	}
	var r ruleResult
	r.wantStatus(k, k.get(roleMain, "/tracking/"+kitFurtherNumber, http.StatusNotFound, "not_found"), http.StatusNotFound, "a further parcel's number (not the primary) found by no lookup")
	return r
}

func judgeTrackingUnknown(k *kit) ruleResult {
	var r ruleResult
	r.wantStatus(k, k.get(roleMain, "/shipments/"+unknownShipment+"/tracking", http.StatusNotFound, "not_found"), http.StatusNotFound, "an unknown shipment id")
	r.wantStatus(k, k.get(roleMain, "/tracking/"+unknownNumber, http.StatusNotFound, "not_found"), http.StatusNotFound, "an unknown tracking number")
	return r
}

func judgeAmbiguousNumber(k *kit) ruleResult {
	if !k.world.own {
		return skip(ownWorldOnly)
	}
	status, code, who := http.StatusNotFound, "not_found", "a number two shipments hold, from a sandbox"
	if k.cfg.profile == "domain_adapter" {
		status, code, who = http.StatusConflict, "ambiguous_tracking_number", "a number two shipments hold, from the domain adapter"
	}
	var r ruleResult
	r.wantStatus(k, k.get(roleMain, "/tracking/"+kitSharedNumber, status, code), status, who)
	return r
}

// ===== check: the catalogue's judges of orders.* =====

// kitPage is a page of GET /v1/orders as the kit reads it: the answer, its JSON (nil for an
// answer other than 200 with a JSON object), its orders each read as far as it goes (and as
// written), and its pagination.
type kitPage struct {
	ex      *exchange
	doc     *jsonValue
	items   []*jsonValue
	orders  []kitOrder
	limit   *jsonValue
	next    *string
	hasMore bool
}

// The members of an order, of a page and of its pagination, with their types.
var (
	orderMembers      = []kitMember{{"id", typeString}, {"merchant_reference", typeString}, {"platform", typeString}, {"status", typeString}, {"shipment_id", typeStringOrNull}, {"created_at", typeString}}
	pageMembers       = []kitMember{{"data", typeArray}, {"pagination", typeObject}}
	paginationMembers = []kitMember{{"limit", typeInteger}, {"next_cursor", typeStringOrNull}, {"has_more", typeBool}}
)

// maxKitPages is the most pages the kit walks along one list.
const maxKitPages = 10

// readPage reads the page of target (the path and query after the base URL) with the main key.
func (k *kit) readPage(target string) *kitPage {
	p := &kitPage{ex: k.get(roleMain, target, http.StatusOK, "")}
	if p.ex.status != http.StatusOK || p.ex.err != nil { // a body cut at 1 MiB is not read: it cannot be JSON
		return p
	}
	doc, err := readJSON(p.ex.body)
	if err != nil || doc.typ != typeObject {
		return p
	}
	p.doc = doc
	data, _ := doc.member("data")
	p.items = data.itemsOrNil()
	for _, item := range p.items {
		p.orders = append(p.orders, orderOf(item))
	}
	pagination, _ := doc.member("pagination")
	p.limit, _ = pagination.member("limit")
	if more, ok := pagination.member("has_more"); ok && more.typ == typeBool {
		p.hasMore = more.boolean
	}
	p.next = pagination.strOrNull("next_cursor")
	return p
}

// orderOf is an order as the kit reads it: its members' strings ("" for any other value).
func orderOf(v *jsonValue) kitOrder {
	return kitOrder{ID: v.str("id"), Reference: v.str("merchant_reference"), Platform: v.str("platform"), Status: v.str("status"),
		ShipmentID: v.strOrNull("shipment_id"), CreatedAt: v.str("created_at")}
}

// walk reads the pages of query (which starts with ?), following next_cursor while has_more
// says more follow, at most maxKitPages pages: the kit's one page walker.
func (k *kit) walk(query string) []*kitPage {
	var pages []*kitPage
	for target := "/orders" + query; len(pages) < maxKitPages; {
		p := k.readPage(target)
		pages = append(pages, p)
		if p.doc == nil || p.next == nil || !p.hasMore || len(*p.next) > 4096 {
			break
		}
		target = "/orders" + query + "&cursor=" + url.QueryEscape(*p.next)
	}
	return pages
}

// listedOrders are the orders of pages, in the order listed.
func listedOrders(pages []*kitPage) []kitOrder {
	var orders []kitOrder
	for _, p := range pages {
		orders = append(orders, p.orders...)
	}
	return orders
}

// everyOrder is the walk of the whole list, 100 a page.
func (k *kit) everyOrder() []*kitPage { return k.walk("?limit=100") }

// noOrders is why an orders rule cannot be judged without an order.
const noOrders = "the key reads no order"

// sentOrder is the order id as the kit sent it, in its own world; nil otherwise.
func (w *kitWorld) sentOrder(id string) *kitOrder {
	if !w.own {
		return nil
	}
	if i := slices.IndexFunc(w.orders, func(o kitOrder) bool { return o.ID == id }); i >= 0 {
		return &w.orders[i]
	}
	return nil
}

// orderFault is what is wrong with an order of a page (written after prefix): its shape, a
// created_at not in UTC, a platform not one of the five, marketplace data; in the kit's
// world, an order it did not send, or one unlike what it sent.
func orderFault(w *kitWorld, item *jsonValue, prefix string) string {
	if f := shapeFault(item, orderMembers, prefix); f != "" {
		return f
	}
	o := orderOf(item)
	if f := orderValueFault(o, prefix); f != "" {
		return f
	}
	if !w.own {
		return ""
	}
	sent := w.sentOrder(o.ID)
	if sent == nil {
		return fmt.Sprintf("%sid %q: an order the kit did not send", prefix, cutField(o.ID, 64))
	}
	return unlikeSent(o, *sent, prefix)
}

// orderValueFault is what of an order's values the spec forbids.
func orderValueFault(o kitOrder, prefix string) string {
	if !utcTimestamp.MatchString(o.CreatedAt) {
		return fmt.Sprintf("%screated_at %q: not UTC with the suffix Z", prefix, cutField(o.CreatedAt, 64))
	}
	if !slices.Contains(platforms, o.Platform) {
		return fmt.Sprintf("%splatform %q, not one of %s", prefix, cutField(o.Platform, 64), strings.Join(platforms, ", "))
	}
	return ""
}

// unlikeSent says how o differs from the order the kit sent, "" when it does not: each
// member by value (created_at by its instant).
func unlikeSent(o, sent kitOrder, prefix string) string {
	at, err := time.Parse(time.RFC3339Nano, o.CreatedAt)
	switch {
	case o.Reference != sent.Reference:
		return fmt.Sprintf("%s%s's merchant_reference %q, sent %q", prefix, sent.ID, cutField(o.Reference, 64), sent.Reference)
	case o.Platform != sent.Platform:
		return fmt.Sprintf("%s%s's platform %q, sent %q", prefix, sent.ID, cutField(o.Platform, 64), sent.Platform)
	case o.Status != sent.Status:
		return fmt.Sprintf("%s%s's status %q, sent %q", prefix, sent.ID, cutField(o.Status, 64), sent.Status)
	case quotedOrNull(o.ShipmentID) != quotedOrNull(sent.ShipmentID):
		return fmt.Sprintf("%s%s's shipment_id %s, %s expected", prefix, sent.ID, quotedOrNull(o.ShipmentID), quotedOrNull(sent.ShipmentID))
	case err != nil || !at.Equal(mustInstant(sent.CreatedAt)):
		return fmt.Sprintf("%s%s's created_at %q, sent %s", prefix, sent.ID, cutField(o.CreatedAt, 64), sent.CreatedAt)
	}
	return ""
}

// marketplaceMember is a member of an order that holds marketplace data, "" when none does.
func marketplaceMember(item *jsonValue) string {
	for _, m := range item.members {
		if l := strings.ToLower(m.name); strings.Contains(l, "token") || strings.Contains(l, "raw") || strings.Contains(l, "payload") {
			return m.name
		}
	}
	return ""
}

// judgeOrderFields: every page of the whole list answers 200 with data and pagination, each
// order as orderFault judges it, none with marketplace data.
func judgeOrderFields(k *kit) ruleResult {
	pages := k.everyOrder()
	var r ruleResult
	for _, p := range pages {
		if p.doc == nil {
			r.fail(k, p.ex, "a page of orders", answerFault(p.ex))
			continue
		}
		f := shapeFault(p.doc, pageMembers, "")
		for i, item := range p.items {
			prefix := fmt.Sprintf("data[%d].", i)
			if f == "" {
				f = orderFault(k.world, item, prefix)
			}
			if name := marketplaceMember(item); f == "" && name != "" {
				f = prefix + name + ": marketplace data"
			}
		}
		if f != "" {
			r.fail(k, p.ex, "each order's id, merchant_reference, platform (one of "+strings.Join(platforms, ", ")+"), status and created_at (UTC, suffix Z) strings, shipment_id a string or null, each once; no marketplace data; in the kit's world, each order as sent", f)
		}
	}
	if len(listedOrders(pages)) == 0 && r.result == "" {
		return skip(noOrders)
	}
	return r
}

func judgeOrderExactFields(k *kit) ruleResult {
	var r ruleResult
	for _, p := range k.everyOrder() {
		pagination, _ := p.doc.member("pagination")
		f := cmp.Or(memberBeyond(p.doc, pageMembers, ""), memberBeyond(pagination, paginationMembers, "pagination."))
		for i, item := range p.items {
			f = cmp.Or(f, memberBeyond(item, orderMembers, fmt.Sprintf("data[%d].", i)))
		}
		if f != "" {
			r.fail(k, p.ex, "the six members of an order, and the page's data and pagination (limit, next_cursor, has_more), none beyond", f)
		}
	}
	return r
}

// judgeOrderList is a rule judged on the orders of the whole list, in the order listed, at
// least least of them: fault says the first thing wrong ("" when nothing is), shown with
// the first page.
func judgeOrderList(least int, expected string, fault func(w *kitWorld, orders []kitOrder) string) func(k *kit) ruleResult {
	return func(k *kit) ruleResult {
		pages := k.everyOrder()
		orders := listedOrders(pages)
		if len(orders) < least {
			return skip(fmt.Sprintf("the key reads %d orders: fewer than %d to judge", len(orders), least))
		}
		var r ruleResult
		if f := fault(k.world, orders); f != "" {
			r.fail(k, pages[0].ex, expected, f)
		}
		return r
	}
}

var judgeOrderOrder = judgeOrderList(2, "newest first: created_at descending, then id descending", func(_ *kitWorld, orders []kitOrder) string {
	for i := 1; i < len(orders); i++ {
		a, b := orders[i-1], orders[i]
		at, errA := time.Parse(time.RFC3339Nano, a.CreatedAt)
		bt, errB := time.Parse(time.RFC3339Nano, b.CreatedAt)
		if errA == nil && errB == nil && (at.Before(bt) || at.Equal(bt) && a.ID < b.ID) {
			return fmt.Sprintf("%s (%s) before %s (%s)", cutField(a.ID, 64), cutField(a.CreatedAt, 64), cutField(b.ID, 64), cutField(b.CreatedAt, 64))
		}
	}
	return ""
})

// judgeOrderVocabulary: every status of an order listed or retrieved is of the vocabulary; in
// the kit's world, each of the vocabulary is listed.
func judgeOrderVocabulary(k *kit) ruleResult {
	pages := k.everyOrder()
	orders := listedOrders(pages)
	if len(orders) == 0 {
		return skip(noOrders)
	}
	var r ruleResult
	listed := map[string]bool{}
	for _, o := range orders {
		listed[o.Status] = true
		if !slices.Contains(orderStatuses, o.Status) {
			r.fail(k, pages[0].ex, "a status of "+strings.Join(orderStatuses, ", "), fmt.Sprintf("order %s of status %q", cutField(o.ID, 64), cutField(o.Status, 64)))
		}
	}
	for _, o := range k.retrievePicks(orders) {
		ex := k.get(roleMain, "/orders/"+url.PathEscape(o.ID), http.StatusOK, "")
		doc, _ := readJSON(ex.body)
		if status := doc.str("status"); ex.status == http.StatusOK && !slices.Contains(orderStatuses, status) {
			r.fail(k, ex, "a status of "+strings.Join(orderStatuses, ", "), fmt.Sprintf("order %s retrieved with status %q", cutField(o.ID, 64), cutField(status, 64)))
		}
	}
	for _, s := range orderStatuses {
		if k.world.own && !listed[s] {
			r.fail(k, pages[0].ex, "each order status listed: the kit sent orders of all four", "no order listed of status "+s)
		}
	}
	return r
}

// retrievePicks are the orders the kit retrieves, of those it sent in its own world, else of
// those listed: the first and the last, the first linked to a shipment, and the first of
// each status.
func (k *kit) retrievePicks(orders []kitOrder) []kitOrder {
	if k.world.own {
		orders = k.world.orders
	}
	picks := []kitOrder{orders[0], orders[len(orders)-1]}
	seen := map[string]bool{orders[0].ID: true, orders[len(orders)-1].ID: true}
	for _, o := range orders {
		first := o.ShipmentID != nil && !slices.ContainsFunc(picks, func(p kitOrder) bool { return p.ShipmentID != nil }) ||
			!slices.ContainsFunc(picks, func(p kitOrder) bool { return p.Status == o.Status })
		if first && !seen[o.ID] && len(o.ID) <= 255 {
			picks, seen[o.ID] = append(picks, o), true
		}
	}
	return picks
}

// judgeRetrieve: each order picked, read by id, equals the order as listed; in the kit's
// world, as sent.
func judgeRetrieve(k *kit) ruleResult {
	pages := k.everyOrder()
	orders := listedOrders(pages)
	if len(orders) == 0 {
		return skip(noOrders)
	}
	listed := map[string]*jsonValue{} // each order as the list wrote it, every member
	for _, p := range pages {
		for i, item := range p.items {
			listed[p.orders[i].ID] = item
		}
	}
	var r ruleResult
	for _, o := range k.retrievePicks(orders) {
		ex := k.get(roleMain, "/orders/"+url.PathEscape(o.ID), http.StatusOK, "")
		if !r.wantStatus(k, ex, http.StatusOK, "the order "+cutField(o.ID, 64)+", which the list shows") {
			continue
		}
		doc, err := readJSON(ex.body)
		sent := k.world.sentOrder(o.ID)
		item, shown := listed[o.ID] // in the kit's world, an order sent that the list did not show is orders.cursor_walk's to judge
		switch {
		case err != nil:
			r.fail(k, ex, "the order, one JSON object", "a body that is not JSON: "+err.Error())
		case shown && !doc.equal(item):
			r.fail(k, ex, "the order as the list shows it: "+cutField(item.String(), maxKitField), "another order")
		case sent != nil && unlikeSent(orderOf(doc), *sent, "") != "":
			r.fail(k, ex, "the order as the kit sent it", unlikeSent(orderOf(doc), *sent, ""))
		}
	}
	return r
}

func judgeOrderUnknown(k *kit) ruleResult {
	var r ruleResult
	r.wantStatus(k, k.get(roleMain, "/orders/"+unknownOrder, http.StatusNotFound, "not_found"), http.StatusNotFound, "an unknown order")
	return r
}

func judgeOrderExactID(k *kit) ruleResult {
	orders := listedOrders(k.everyOrder())
	i := slices.IndexFunc(orders, func(o kitOrder) bool { return swapCase(o.ID) != o.ID && len(o.ID) <= 255 })
	if i < 0 {
		return skip("no order listed whose id has a letter whose case can change")
	}
	var r ruleResult
	alias := swapCase(orders[i].ID)
	wantNotOther(k, &r, k.get(roleMain, "/orders/"+url.PathEscape(alias), http.StatusNotFound, "not_found"), "id", alias)
	return r
}

// pageSizeFault is what is wrong with the first page of a list whose limit is limit: the
// limit applied, at most limit orders, limit when more follow (in the kit's world more do).
func (k *kit) pageSizeFault(p *kitPage, limit int64) string {
	applied, ok := p.limit.integer()
	switch {
	case p.doc == nil:
		return answerFault(p.ex)
	case !ok || applied != limit || int64(len(p.items)) > limit || (p.hasMore || k.world.own) && int64(len(p.items)) != limit:
		return fmt.Sprintf("limit %s, %d orders, has_more %v", cutField(p.limit.String(), 32), len(p.items), p.hasMore)
	}
	return ""
}

func judgeDefaultLimit(k *kit) ruleResult {
	var r ruleResult
	if p := k.readPage("/orders"); k.pageSizeFault(p, 20) != "" {
		r.fail(k, p.ex, "limit 20 when none is sent: at most 20 orders, 20 when more follow", k.pageSizeFault(p, 20))
	}
	return r
}

func judgeMaxLimit(k *kit) ruleResult {
	var r ruleResult
	if p := k.readPage("/orders?limit=100"); k.pageSizeFault(p, 100) != "" {
		r.fail(k, p.ex, "limit=100 applied: at most 100 orders, 100 when more follow", k.pageSizeFault(p, 100))
	}
	over := k.readPage("/orders?limit=101")
	applied, ok := over.limit.integer()
	switch {
	case over.ex.status >= 400 && over.ex.status < 500:
	case over.doc == nil:
		r.fail(k, over.ex, "limit=101, past the maximum: refused (4xx), or a page of at most 100", answerFault(over.ex))
	case len(over.items) > 100 || !ok || applied > 100:
		r.fail(k, over.ex, "limit=101, past the maximum: refused (4xx), or a page of at most 100", fmt.Sprintf("limit %s, %d orders", cutField(over.limit.String(), 32), len(over.items)))
	}
	return r
}

func judgePagination(k *kit) ruleResult {
	pages := k.everyOrder()
	var r ruleResult
	judged := 0
	for _, p := range pages {
		if p.doc == nil {
			continue
		}
		judged++
		pagination, _ := p.doc.member("pagination")
		limit, ok := p.limit.integer()
		if f := shapeFault(pagination, paginationMembers, "pagination."); f != "" || !ok || limit < 1 || p.hasMore != (p.next != nil) {
			r.fail(k, p.ex, "limit an integer of at least 1; has_more false exactly when next_cursor is null", cmp.Or(f, fmt.Sprintf("limit %s, has_more %v, next_cursor null %v", cutField(p.limit.String(), 32), p.hasMore, p.next == nil)))
		}
	}
	if judged == 0 {
		return skip("no page of orders answered 200 with a JSON object (see orders.fields)")
	}
	return r
}

func judgeCursorWalk(k *kit) ruleResult {
	pages := k.everyOrder()
	if len(pages) < 2 {
		return skip("the list is one page: no next_cursor to follow")
	}
	var r ruleResult
	last := pages[len(pages)-1].ex
	seen := map[string]bool{}
	for _, o := range listedOrders(pages) {
		if seen[o.ID] {
			r.fail(k, last, "each order once along the pages", "order "+cutField(o.ID, 64)+" shown twice")
			return r
		}
		seen[o.ID] = true
	}
	for _, o := range k.world.orders {
		if k.world.own && !seen[o.ID] {
			r.fail(k, last, fmt.Sprintf("the %d orders the kit sent along the pages", len(k.world.orders)), fmt.Sprintf("%d orders; %s not among them", len(seen), o.ID))
			break
		}
	}
	for id := range seen {
		if k.world.own && k.world.sentOrder(id) == nil {
			r.fail(k, last, "only the orders the kit sent along the pages", "order "+cutField(id, 64)+", which the kit did not send")
			break
		}
	}
	return r
}

func judgeMalformedCursor(k *kit) ruleResult {
	var r ruleResult
	cursors := []string{"not-a-cursor", "AAAA"}
	if pages := k.everyOrder(); pages[0].next != nil && len(*pages[0].next) > 1 { // a real one, cut short
		c := *pages[0].next
		cursors = append(cursors, c[:len(c)/2])
	}
	for _, c := range cursors {
		r.wantStatus(k, k.get(roleMain, "/orders?limit=100&cursor="+url.QueryEscape(c), http.StatusBadRequest, "invalid_cursor"), http.StatusBadRequest, "a malformed cursor")
	}
	return r
}

func judgeFilterStatus(k *kit) ruleResult {
	if len(k.world.orders) == 0 {
		return skip(noOrders)
	}
	var r ruleResult
	for _, status := range orderStatuses {
		pages := k.walk("?limit=100&status=" + status)
		listed := map[string]bool{}
		for _, o := range listedOrders(pages) {
			listed[o.ID] = true
			if o.Status != status {
				r.fail(k, pages[0].ex, "only orders of status "+status, "order "+cutField(o.ID, 64)+" of status "+cutField(o.Status, 64))
				break
			}
		}
		for _, o := range k.world.orders {
			if k.world.own && o.Status == status && !listed[o.ID] {
				r.fail(k, pages[0].ex, "every order of status "+status+" the kit sent", o.ID+" not listed")
				break
			}
		}
	}
	return r
}

func judgeFilterCreated(k *kit) ruleResult {
	w := k.world
	if w.from == "" {
		return skip("needs two orders to filter between: the key reads fewer")
	}
	from, errFrom := time.Parse(time.RFC3339Nano, w.from)
	to, errTo := time.Parse(time.RFC3339Nano, w.to)
	if errFrom != nil || errTo != nil {
		return skip("the orders read have no RFC 3339 created_at to filter on (see orders.fields)")
	}
	var r ruleResult
	pages := k.walk("?limit=100&created_from=" + url.QueryEscape(w.from) + "&created_to=" + url.QueryEscape(w.to))
	listed := map[string]bool{}
	for _, o := range listedOrders(pages) {
		listed[o.ID] = true
		if at, err := time.Parse(time.RFC3339Nano, o.CreatedAt); err != nil || at.Before(from) || at.After(to) {
			r.fail(k, pages[0].ex, "only orders created from "+w.from+" to "+w.to+", both included", "order "+cutField(o.ID, 64)+" created at "+cutField(o.CreatedAt, 64))
			return r
		}
	}
	for _, o := range w.orders {
		at, err := time.Parse(time.RFC3339Nano, o.CreatedAt)
		inside := err == nil && !at.Before(from) && !at.After(to)
		if inside && !listed[o.ID] && (w.own || o.CreatedAt == w.from || o.CreatedAt == w.to) {
			r.fail(k, pages[0].ex, "the orders created at exactly "+w.from+" and "+w.to+" included, and all between", cutField(o.ID, 64)+" (created at "+cutField(o.CreatedAt, 64)+") not listed")
			break
		}
	}
	return r
}

// judgeLinkedShipment: the linked order shows its shipment, and that shipment's tracking view
// answers (a link to a shipment that answers 404 fails it).
func judgeLinkedShipment(k *kit) ruleResult {
	order, shipment := k.world.linked[0], k.world.linked[1]
	if order == "" {
		return skip("no order read is linked to a shipment")
	}
	var r ruleResult
	ex := k.get(roleMain, "/orders/"+url.PathEscape(order), http.StatusOK, "")
	if !r.wantStatus(k, ex, http.StatusOK, "the linked order "+cutField(order, 64)) {
		return r
	}
	if doc, _ := readJSON(ex.body); doc.strOrNull("shipment_id") == nil || *doc.strOrNull("shipment_id") != shipment {
		r.fail(k, ex, "shipment_id "+cutField(shipment, 64), "shipment_id "+quotedOrNull(doc.strOrNull("shipment_id")))
		return r
	}
	v := k.view(shipment)
	if r.wantStatus(k, v.ex, http.StatusOK, "the tracking view of the order's shipment_id") && v.doc.str("shipment_id") != shipment {
		r.fail(k, v.ex, "the view of "+cutField(shipment, 64), "the view of "+quotedOrNull(v.doc.strOrNull("shipment_id")))
	}
	return r
}

func judgeLimitRange(k *kit) ruleResult {
	var r ruleResult
	for _, limit := range []string{"0", "101"} {
		ex := k.get(roleMain, "/orders?limit="+limit, http.StatusUnprocessableEntity, "invalid_parameter")
		if r.wantStatus(k, ex, http.StatusUnprocessableEntity, "limit="+limit) {
			if doc, _ := readJSON(ex.body); doc.str("param") != "limit" {
				r.fail(k, ex, "422 invalid_parameter naming limit in param", "param "+quotedOrNull(doc.strOrNull("param")))
			}
		}
	}
	return r
}

// judgeCursorFilters: a cursor sent with another status, created_from or created_to than
// the page that issued it is refused.
func judgeCursorFilters(k *kit) ruleResult {
	w := k.world
	var r ruleResult
	sent := 0
	other := func(query, changed string) {
		p := k.readPage("/orders" + query)
		if p.next == nil || len(*p.next) > 4096 {
			return
		}
		sent++
		ex := k.get(roleMain, "/orders"+changed+"&cursor="+url.QueryEscape(*p.next), http.StatusBadRequest, "invalid_cursor")
		r.wantStatus(k, ex, http.StatusBadRequest, "a cursor of "+query+" sent with "+changed)
	}
	other("?limit=2&status="+orderStatuses[0], "?limit=2&status="+orderStatuses[2])
	from, errFrom := time.Parse(time.RFC3339Nano, w.from)
	to, errTo := time.Parse(time.RFC3339Nano, w.to)
	if errFrom == nil && errTo == nil { // each bound moved out by a second: other filters, as valid
		created := "?limit=2&created_from=" + url.QueryEscape(w.from) + "&created_to=" + url.QueryEscape(w.to)
		earlier, later := from.Add(-time.Second).Format(time.RFC3339Nano), to.Add(time.Second).Format(time.RFC3339Nano)
		other(created, "?limit=2&created_from="+url.QueryEscape(earlier)+"&created_to="+url.QueryEscape(w.to))
		other(created, "?limit=2&created_from="+url.QueryEscape(w.from)+"&created_to="+url.QueryEscape(later))
	}
	if sent == 0 {
		return skip("no filtered page of two has a next_cursor to send with other filters")
	}
	return r
}

// ===== check: the catalogue's judges of http.*, errors.* and limits.* =====

func judgeMethodNotAllowed(k *kit) ruleResult {
	var r ruleResult
	for _, target := range k.operationTargets() {
		for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} { // no body: a write is never meant
			ex := k.send(kitRequest{method: method, target: target, role: roleMain, status: http.StatusMethodNotAllowed, code: "method_not_allowed"})
			r.wantStatus(k, ex, http.StatusMethodNotAllowed, method+" on an operation that answers GET")
		}
	}
	return r
}

func judgeBodyTooLarge(k *kit) ruleResult {
	var r ruleResult
	ex := k.send(kitRequest{method: http.MethodGet, target: "/orders", role: roleMain, body: bytes.Repeat([]byte("x"), 256<<10+1), status: http.StatusRequestEntityTooLarge, code: "body_too_large"})
	r.wantStatus(k, ex, http.StatusRequestEntityTooLarge, "a body of 256 KiB + 1 byte")
	return r
}

// judgeAnswers is a rule judged on every answer the rules run got: fault says what is wrong
// with one ("" when nothing is; ok false when the rule does not judge it), which the rule
// expected not to be. It cites the first maxCited and counts them all; a rule that judges no
// answer is a skip.
func judgeAnswers(expected, none string, fault func(ex *exchange) (string, bool)) func(k *kit) ruleResult {
	return func(k *kit) ruleResult {
		var r ruleResult
		judged := 0
		for _, ex := range k.judged {
			f, ok := fault(ex)
			if !ok || ex.status == 0 {
				continue
			}
			judged++
			if f != "" {
				r.fail(k, ex, expected, f)
			}
		}
		if judged == 0 {
			return skip(none)
		}
		return r
	}
}

// problemMembers is an error answer's members and their types.
var problemMembers = []kitMember{{"type", typeString}, {"title", typeString}, {"status", typeInteger}, {"detail", typeString}, {"code", typeString}, {"request_id", typeString}}

var (
	judgeUniqueMembers = judgeAnswers("each member of a JSON answer named once", "no answer held JSON", func(ex *exchange) (string, bool) {
		if ex.err != nil { // cut: judged by the rule that sent it
			return "", false
		}
		doc, err := readJSON(ex.body)
		if err != nil {
			return "", false
		}
		if p := repeatedMember(doc, "$"); p != "" {
			return "member " + cutField(p, 128) + " written twice", true
		}
		return "", true
	})
	judgeProblemJSON = judgeAnswers("application/problem+json with type, title, status (the answer's), detail, code and request_id", "no answer was an error", func(ex *exchange) (string, bool) {
		if ex.status < 400 {
			return "", false
		}
		ct, _, _ := mime.ParseMediaType(ex.header.Get("Content-Type"))
		doc, _ := readJSON(ex.body)
		f := shapeFault(doc, problemMembers, "")
		if status, _ := doc.member("status"); f == "" && !status.equal(&jsonValue{typ: typeNumber, text: strconv.Itoa(ex.status)}) {
			f = fmt.Sprintf("status %s in the body", cutField(status.String(), 32))
		}
		if ct != "application/problem+json" {
			f = strings.TrimSuffix("Content-Type "+strconv.Quote(cutField(ex.header.Get("Content-Type"), 128))+"; "+f, "; ")
		}
		return f, true
	})
	judgeCodes = judgeAnswers("the code the contract gives the case", "no answer had the status the kit expected of an error", func(ex *exchange) (string, bool) {
		if ex.req.code == "" || ex.status != ex.req.status {
			return "", false
		}
		if doc, _ := readJSON(ex.body); doc.str("code") != ex.req.code {
			return fmt.Sprintf("code %s on this %d, not %s", quotedOrNull(doc.strOrNull("code")), ex.status, ex.req.code), true
		}
		return "", true
	})
	judgeRequestID = judgeAnswers("a Request-Id on every answer", "no answer", func(ex *exchange) (string, bool) {
		if strings.TrimSpace(ex.header.Get("Request-Id")) == "" {
			return "no Request-Id", true
		}
		return "", true
	})
	judgeNoStore = judgeAnswers("Cache-Control: no-store on every answer", "no answer", func(ex *exchange) (string, bool) {
		if !hasDirective(ex.header.Values("Cache-Control"), "no-store") {
			return "Cache-Control " + strconv.Quote(cutField(strings.Join(ex.header.Values("Cache-Control"), ", "), 128)), true
		}
		return "", true
	})
)

// hasDirective reports whether a Cache-Control field, its lines joined as one list (RFC 9110,
// 5.3), holds the directive name, its case aside (RFC 9111, 5.2).
func hasDirective(lines []string, name string) bool {
	for _, d := range strings.Split(strings.Join(lines, ","), ",") {
		directive, _, _ := strings.Cut(strings.TrimSpace(d), "=")
		if strings.EqualFold(strings.TrimSpace(directive), name) {
			return true
		}
	}
	return false
}

// maxBurst is the most requests the rate limit's rule sends before it gives up, and
// burstWorkers how many it has in flight at once.
const (
	maxBurst     = 1000
	burstWorkers = 4
)

// burst sends GET /v1/orders?limit=1 as fast as the kit can (burstWorkers at once), with a
// key of its own (the main key where the world has none), until one answers 429, at most
// maxBurst: the rate limit's rules judge its answers, the 429 last. It is sent once a run.
func (k *kit) burst() []*exchange {
	if k.bursted != nil {
		return k.bursted
	}
	role := roleBurst
	if k.keys[role] == "" {
		role = roleMain
	}
	k.pace.mu.Lock()
	k.pace.off = true
	k.pace.mu.Unlock()
	defer func() { k.pace.mu.Lock(); k.pace.off = false; k.pace.mu.Unlock() }()
	var (
		mu       sync.Mutex
		started  int         // never more than maxBurst
		answered []*exchange // in the order they came
		limited  *exchange   // the first 429, or the first request without an answer: it ends the burst
		wg       sync.WaitGroup
	)
	r := kitRequest{method: http.MethodGet, target: "/orders?limit=1", role: role, status: http.StatusOK}
	for range burstWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				if limited != nil || started == maxBurst || k.ctx.Err() != nil {
					mu.Unlock()
					return
				}
				started++
				mu.Unlock()
				ex := k.sendOnce(r)
				mu.Lock()
				answered = append(answered, ex)
				if limited == nil && (ex.status == http.StatusTooManyRequests || ex.err != nil) {
					limited = ex
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if limited != nil { // the answer that ended it, last
		answered = append(slices.DeleteFunc(answered, func(ex *exchange) bool { return ex == limited }), limited)
	}
	k.bursted = answered
	return k.bursted
}

func judgeRateLimit(k *kit) ruleResult {
	exs := k.burst()
	k.used[k.rule] = append(k.used[k.rule], exs...)
	last := exs[len(exs)-1]
	var r ruleResult
	if last.status != http.StatusTooManyRequests {
		r.fail(k, last, fmt.Sprintf("429 past the limit, within %d requests sent as fast as the kit can", maxBurst), fmt.Sprintf("%d requests, the last answered %d", len(exs), last.status))
	}
	return r
}

// passedTheKeyCheck reports whether an answer came from past a key check (what states the
// rate limit): a key of the run sent, and no answer that the route, the method, the declared
// size, the key or the live environment gives first.
func passedTheKeyCheck(ex *exchange) bool {
	switch ex.status {
	case 0, http.StatusUnauthorized, http.StatusMethodNotAllowed, http.StatusRequestEntityTooLarge, http.StatusServiceUnavailable:
		return false
	}
	return ex.req.role != roleNone && ex.req.unknownKey == ""
}

// judgeRateLimitHeaders: in full mode, once the burst met the limit, every answer past the
// key check (the burst's and every rule's) states the limit in RateLimit-Policy (a policy
// with q) and RateLimit (with r), well formed; the 429 says when to retry in whole seconds.
func judgeRateLimitHeaders(k *kit) ruleResult {
	exs := k.burst()
	last := exs[len(exs)-1]
	if last.status != http.StatusTooManyRequests {
		return skip("the burst met no 429: no limit to state (see limits.rate_limit)")
	}
	var r ruleResult
	for _, ex := range append(slices.Clone(k.judged), exs...) {
		if !passedTheKeyCheck(ex) {
			continue
		}
		policy, errP := parseRateLimitField(ex.header.Values("RateLimit-Policy"))
		limit, errL := parseRateLimitField(ex.header.Values("RateLimit"))
		_, quota := firstParam(policy, "q")
		_, left := firstParam(limit, "r")
		if errP != nil || errL != nil || !quota || !left {
			r.fail(k, ex, "RateLimit-Policy (a policy with q) and RateLimit (with r), as the IETF draft writes them, on every answer past the key check",
				fmt.Sprintf("RateLimit-Policy %q, RateLimit %q", cutField(strings.Join(ex.header.Values("RateLimit-Policy"), ", "), 128), cutField(strings.Join(ex.header.Values("RateLimit"), ", "), 128)))
		}
	}
	if _, err := strconv.ParseUint(strings.TrimSpace(last.header.Get("Retry-After")), 10, 31); err != nil || len(last.header.Values("Retry-After")) != 1 {
		r.fail(k, last, "Retry-After in whole seconds on the 429", fmt.Sprintf("Retry-After %q", cutField(strings.Join(last.header.Values("Retry-After"), ", "), 128)))
	}
	return r
}

// firstParam is the parameter name of a field's first item.
func firstParam(items []rateLimitItem, name string) (int64, bool) {
	if len(items) == 0 {
		return 0, false
	}
	v, ok := items[0].params[name]
	return v, ok
}

// ===== check: its reports =====

// checkReport is a run's report, as its JSON writes it: members in this order. check diff
// reads it back, of any version of the kit.
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
	Stale      int `json:"stale"`
	Evaluated  int `json:"evaluated"`
	Requests   int `json:"requests"`
	Retried    int `json:"retried"`
}

// reportSchema is the JSON schema of the report, derived from its types: each member
// required, none beyond them, and the values of its words. The MCP door's check_server
// answers a report, and lists this as its success.
func reportSchema() map[string]any {
	schema := schemaOf(reflect.TypeFor[checkReport]())
	schema["description"] = "The conformance kit's report: the server, each rule's result and evidence, the summary."
	return schema
}

// reportWords are the values a word of the report takes, by its member's name.
var reportWords = map[string][]string{"profile": {"sandbox", "domain_adapter"}, "mode": {"safe", "full"}, "world": {"own", "discovered"},
	"level": {string(levelMust), string(levelShould)}, "result": {"pass", "fail", "skip", "expected"}}

// schemaOf is the JSON schema of a type of the report, as encoding/json writes it.
func schemaOf(t reflect.Type) map[string]any {
	switch t.Kind() {
	case reflect.Pointer:
		s := schemaOf(t.Elem())
		s["type"] = []any{s["type"], "null"}
		return s
	case reflect.Slice:
		return map[string]any{"type": "array", "items": schemaOf(t.Elem())}
	case reflect.Int:
		return map[string]any{"type": "integer"}
	case reflect.String:
		return map[string]any{"type": "string"}
	}
	properties, required := map[string]any{}, []any{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		member := schemaOf(f.Type)
		if words, ok := reportWords[name]; ok {
			member["enum"] = words
		}
		properties[name], required = member, append(required, name)
	}
	return map[string]any{"type": "object", "required": required, "properties": properties, "additionalProperties": false}
}

// report is the run's report of the rules reported, in the catalogue's order, with -expect
// applied.
func (k *kit) report(results map[string]ruleResult, reported map[string]bool) *checkReport {
	rep := &checkReport{BaseURL: k.base, Profile: k.cfg.profile, Mode: "safe", World: "discovered", Warnings: append(append([]string{}, k.readWarnings()...), k.warnings...), Rules: []ruleReport{}}
	if k.cfg.full {
		rep.Mode = "full"
	}
	if k.world != nil && k.world.own {
		rep.World = "own"
	}
	s := &rep.Summary
	for i := range kitRules {
		r := &kitRules[i]
		if !reported[r.id] {
			continue
		}
		res, stale := k.cfg.withExpectation(r.id, results[r.id])
		rr := ruleReport{ID: r.id, Level: r.levelFor(k.cfg.profile), Title: r.title, Spec: r.spec, Result: res.result, Evidence: res.evidence}
		if rr.Evidence == nil {
			rr.Evidence = []checkEvidence{}
		}
		if res.reason != "" {
			rr.Reason = &res.reason
		}
		rep.Rules = append(rep.Rules, rr)
		s.Total++
		switch res.result {
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
		if stale {
			s.Stale++
		}
	}
	s.Evaluated = s.Total - s.Skipped
	s.Requests, s.Retried = int(k.requests.Load()), k.retried
	k.secrets.maskReport(rep)
	return rep
}

// maskReport masks what a report holds of what a server sent or the user gave: the base
// URL, the warnings, and each rule's reason and evidence.
func (s *secrets) maskReport(rep *checkReport) {
	rep.BaseURL = s.mask(rep.BaseURL)
	for i := range rep.Warnings {
		rep.Warnings[i] = s.mask(rep.Warnings[i])
	}
	for i := range rep.Rules {
		r := &rep.Rules[i]
		if r.Reason != nil {
			r.Reason = ptr(s.mask(*r.Reason))
		}
		for j := range r.Evidence {
			e := &r.Evidence[j]
			e.Expected, e.Seen, e.Curl, e.RequestID = s.mask(e.Expected), s.mask(e.Seen), s.mask(e.Curl), s.mask(e.RequestID)
		}
	}
}

// expectation is the reason -expect gives the rule id, and the entry that gives it: an entry
// of its id wins over a prefix, and of two prefixes the longer, so that a reason is never
// chosen at random.
func (cfg *checkConfig) expectation(id string) (entry, reason string, ok bool) {
	if reason, ok := cfg.expect[id]; ok {
		return id, reason, true
	}
	for name, why := range cfg.expect {
		if prefix, isPrefix := strings.CutSuffix(name, "*"); isPrefix && strings.HasPrefix(id, prefix) && len(name) > len(entry) {
			entry, reason, ok = name, why, true
		}
	}
	return entry, reason, ok
}

// withExpectation is a rule's result as -expect makes it: a failure it names is expected; a
// pass it names is stale (it fails the run: the difference went away, and the entry goes);
// a skip stays a skip.
func (cfg *checkConfig) withExpectation(id string, res ruleResult) (ruleResult, bool) {
	entry, reason, ok := cfg.expectation(id)
	switch {
	case !ok:
	case res.result == "fail":
		res.result, res.reason = "expected", reason
	case res.result == "pass":
		res.reason = fmt.Sprintf("expected to fail (%s), but passes: the expectation is stale; remove %q from %s", reason, entry, cfg.expectFile)
		return res, true
	}
	return res, false
}

// readWarnings are what would make a pass meaningless: most of the reads the kit expected to
// succeed were refused (401, 403, 429) or failed (5xx).
func (k *kit) readWarnings() []string {
	reads, refused := 0, map[int]int{}
	for _, exs := range k.used {
		for _, ex := range exs {
			if ex.req.status != http.StatusOK {
				continue
			}
			reads++
			if ex.status == http.StatusUnauthorized || ex.status == http.StatusForbidden || ex.status == http.StatusTooManyRequests || ex.status >= 500 {
				refused[ex.status]++
			}
		}
	}
	n := 0
	var counts []string
	for _, status := range slices.Sorted(maps.Keys(refused)) {
		n += refused[status]
		counts = append(counts, fmt.Sprintf("%d: %d", status, refused[status]))
	}
	if reads == 0 || 2*n <= reads {
		return nil
	}
	return []string{fmt.Sprintf("%d of the %d reads the kit expected to succeed were refused or failed (%s): a rule that passed on them judged little; check the keys (-key and the others), the rate limit and the environment (a live key answers 503 while live is not released)", n, reads, strings.Join(counts, ", "))}
}

// render writes the report in format: text, json or junit.
func (rep *checkReport) render(w io.Writer, format string) error {
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
	return rep.writeText(w)
}

// resultMarks are how the text report marks each result.
var resultMarks = map[string]string{"pass": "PASS", "fail": "FAIL", "skip": "SKIP", "expected": "XFAIL"}

// writeText writes the report as text: a first line naming the server, the warnings, a line a
// rule, each failure (expected ones too) followed by its evidence, a field a line, and the
// summary. Whatever a server sent is escaped: it can forge no line and move no cursor.
func (rep *checkReport) writeText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "Conformance of %s (profile %s, mode %s, world %s)\n", printable(rep.BaseURL), printable(rep.Profile), printable(rep.Mode), printable(rep.World))
	for _, warning := range rep.Warnings {
		fmt.Fprintf(&b, "WARNING %s\n", printable(warning))
	}
	for _, r := range rep.Rules {
		fmt.Fprintf(&b, "%-5s %s  %s", resultMarks[r.Result], printable(r.ID), printable(r.Title))
		if r.Reason != nil {
			fmt.Fprintf(&b, " (%s)", printable(*r.Reason))
		}
		b.WriteString("\n")
		if r.Result == "fail" || r.Result == "expected" {
			b.WriteString(evidenceText(r.Evidence, "      "))
		}
	}
	b.WriteString(rep.Summary.line() + "\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// line is the summary as the text report's last line writes it.
func (s reportSummary) line() string {
	return fmt.Sprintf("%d rules: %d passed, %d failed (%d MUST), %d skipped, %d expected, %d stale; evaluated %d of %d",
		s.Total, s.Passed, s.Failed, s.FailedMust, s.Skipped, s.Expected, s.Stale, s.Evaluated, s.Total)
}

// evidenceText is a rule's evidence, a field a line after indent, each escaped; an empty
// request id has no line.
func evidenceText(evidence []checkEvidence, indent string) string {
	var b strings.Builder
	for _, e := range evidence {
		fmt.Fprintf(&b, "%sexpected: %s\n%sseen: %s\n%s%s\n", indent, printable(e.Expected), indent, printable(e.Seen), indent, printable(e.Curl))
		if e.RequestID != "" {
			fmt.Fprintf(&b, "%srequest id: %s\n", indent, printable(e.RequestID))
		}
	}
	return b.String()
}

// writeJUnit writes the report as one JUnit test suite: a test case a rule (its class the
// id's part before the dot), a failure with its evidence, a skip with its reason, and an
// expected failure as a skip that says so, with its evidence.
func (rep *checkReport) writeJUnit(w io.Writer) error {
	var b strings.Builder
	s := rep.Summary
	fmt.Fprintf(&b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuite name=\"conformance\" tests=\"%d\" failures=\"%d\" skipped=\"%d\">\n", s.Total, s.Failed, s.Skipped+s.Expected)
	for _, r := range rep.Rules {
		class, _, _ := strings.Cut(r.ID, ".")
		fmt.Fprintf(&b, "  <testcase classname=\"%s\" name=\"%s\">", xmlText(class), xmlText(r.ID))
		reason := ""
		if r.Reason != nil {
			reason = *r.Reason
		}
		switch r.Result {
		case "fail":
			fmt.Fprintf(&b, "\n    <failure message=\"%s: %s\">%s</failure>\n  ", xmlText(string(r.Level)), xmlText(r.Title), xmlText(evidenceText(r.Evidence, "")))
		case "skip":
			fmt.Fprintf(&b, "\n    <skipped message=\"%s\"/>\n  ", xmlText(reason))
		case "expected":
			fmt.Fprintf(&b, "\n    <skipped message=\"expected failure: %s\">%s</skipped>\n  ", xmlText(reason), xmlText(evidenceText(r.Evidence, "")))
		}
		b.WriteString("</testcase>\n")
	}
	b.WriteString("</testsuite>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// ===== check: check diff, two reports side by side =====

// A rule's change from one report to another: same, regressed (NEW fail, OLD anything
// else), improved (OLD fail, NEW pass), changed (any other difference of result), added (in
// NEW only) or removed (in OLD only).

// reportDiff is check diff's answer, as its JSON writes it: members in this order.
type reportDiff struct {
	Old     diffServer   `json:"old"`
	New     diffServer   `json:"new"`
	Rules   []ruleChange `json:"rules"`
	Summary diffSummary  `json:"summary"`

	warnings [2][]string // each report's warnings, which the text says before the rules
}

type diffServer struct {
	BaseURL string `json:"base_url"`
	Profile string `json:"profile"`
	Mode    string `json:"mode"`
	World   string `json:"world"`
}

type ruleChange struct {
	ID     string  `json:"id"`
	Change string  `json:"change"`
	Old    *string `json:"old"`
	New    *string `json:"new"`
	Reason *string `json:"reason"`

	oldWhy *string // OLD's reason or first evidence, which the text says when NEW gives none
}

type diffSummary struct {
	Total     int `json:"total"`
	Same      int `json:"same"`
	Regressed int `json:"regressed"`
	Improved  int `json:"improved"`
	Changed   int `json:"changed"`
	Added     int `json:"added"`
	Removed   int `json:"removed"`
}

// runDiff is check diff OLD.json NEW.json: flags before, between or after the two files.
func runDiff(args []string, stdout, stderr io.Writer) int {
	var all bool
	format, out := "text", ""
	fs := flag.NewFlagSet("sandbox check diff", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.BoolVar(&all, "all", false, "list every rule, the same ones too")
	fs.Func("format", "the comparison's `format`: text (default) or json", oneOfFlag(&format, "text", "json"))
	fs.StringVar(&out, "out", "", "write the comparison to this `file` (default: standard output)")
	var files []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fmt.Fprintln(stdout, "Usage: sandbox check diff [-all] [-format text|json] [-out FILE] OLD.json NEW.json: two JSON reports of check compared rule by rule. Exit status: 0 no rule regressed, 1 one did, 2 a report cannot be read.")
				fs.SetOutput(stdout)
				fs.PrintDefaults()
				return checkPassed
			}
			fmt.Fprintln(stderr, "sandbox check diff: "+err.Error()+" (see check diff -h for the flags)")
			return checkCannotJudge
		}
		if args = fs.Args(); len(args) == 0 {
			break
		}
		files, args = append(files, args[0]), args[1:]
	}
	if len(files) != 2 {
		fmt.Fprintf(stderr, "sandbox check diff: want two reports, OLD.json NEW.json (check -format json writes them); got %d\n", len(files))
		return checkCannotJudge
	}
	var reps [2]*checkReport
	for i, f := range files {
		var err error
		if reps[i], err = readKitReport(f); err != nil {
			fmt.Fprintf(stderr, "sandbox check diff: %s: %v\n", f, err)
			return checkCannotJudge
		}
	}
	d := diffReports(reps[0], reps[1], all)
	if err := writeDiff(out, stdout, d, format); err != nil {
		fmt.Fprintln(stderr, "sandbox check diff: writing the comparison: "+err.Error())
		return checkCannotJudge
	}
	if d.Summary.Regressed > 0 {
		return checkFailed
	}
	return checkPassed
}

// maxReportBytes is the largest report check diff reads.
const maxReportBytes = 64 << 20

// readKitReport reads a JSON report of the kit, of any version: an object with the server's
// base_url and a list of rules, each with its id and result.
func readKitReport(file string) (*checkReport, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxReportBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxReportBytes {
		return nil, fmt.Errorf("over %d MiB: not a report of the kit", maxReportBytes>>20)
	}
	var probe struct {
		BaseURL *string `json:"base_url"`
		Rules   *[]struct {
			ID     *string `json:"id"`
			Result *string `json:"result"`
		} `json:"rules"`
	}
	if err := json.Unmarshal(b, &probe); err != nil {
		return nil, fmt.Errorf("not a JSON report of the kit (check -format json writes one): %v", err)
	}
	if probe.BaseURL == nil || probe.Rules == nil {
		return nil, errors.New("not a report of the kit: it has no base_url, or no rules (check -format json writes one)")
	}
	for i, r := range *probe.Rules {
		if r.ID == nil || r.Result == nil || resultMarks[*r.Result] == "" {
			return nil, fmt.Errorf("not a report of the kit: its rule %d has no id, or no result of pass, fail, skip or expected", i+1)
		}
	}
	var rep checkReport
	json.Unmarshal(b, &rep)
	return &rep, nil
}

// diffReports compares two reports rule by rule, in NEW's order, then the rules OLD alone
// holds; all lists the rules that are the same too.
func diffReports(old, new *checkReport, all bool) *reportDiff {
	d := &reportDiff{Old: serverOf(old), New: serverOf(new), Rules: []ruleChange{}, warnings: [2][]string{old.Warnings, new.Warnings}}
	olds := map[string]*ruleReport{}
	for i := range old.Rules {
		olds[old.Rules[i].ID] = &old.Rules[i]
	}
	news := map[string]bool{}
	for i := range new.Rules {
		n := &new.Rules[i]
		news[n.ID] = true
		d.add(changeOf(olds[n.ID], n), all)
	}
	for i := range old.Rules {
		if o := &old.Rules[i]; !news[o.ID] {
			d.add(changeOf(o, nil), all)
		}
	}
	return d
}

func serverOf(rep *checkReport) diffServer {
	return diffServer{rep.BaseURL, rep.Profile, rep.Mode, rep.World}
}

// changeOf is the change of one rule from o to n (either nil where the report lacks it),
// with why: NEW's reason (a skip's, an expectation's) or its first evidence; and OLD's, for
// the text, where NEW gives none.
func changeOf(o, n *ruleReport) ruleChange {
	c := ruleChange{}
	if o != nil {
		c.ID, c.Old = o.ID, &o.Result
	}
	if n != nil {
		c.ID, c.New, c.Reason = n.ID, &n.Result, whyOf(n)
	}
	if o != nil && c.Reason == nil && (n == nil || o.Result != n.Result) {
		c.oldWhy = whyOf(o)
	}
	switch {
	case o == nil:
		c.Change = "added"
	case n == nil:
		c.Change = "removed"
	case o.Result == n.Result:
		c.Change = "same"
	case n.Result == "fail":
		c.Change = "regressed"
	case o.Result == "fail" && n.Result == "pass":
		c.Change = "improved"
	default:
		c.Change = "changed"
	}
	return c
}

// whyOf is what a report says of a rule's result: its reason, or its first evidence; nil for
// a pass without either.
func whyOf(r *ruleReport) *string {
	if r.Reason == nil && len(r.Evidence) > 0 {
		return ptr("expected: " + r.Evidence[0].Expected + "; seen: " + r.Evidence[0].Seen)
	}
	return r.Reason
}

// add counts a rule's change, and lists it unless it is the same (with all, every one).
func (d *reportDiff) add(c ruleChange, all bool) {
	s := &d.Summary
	s.Total++
	counts := map[string]*int{"same": &s.Same, "regressed": &s.Regressed, "improved": &s.Improved, "changed": &s.Changed, "added": &s.Added, "removed": &s.Removed}
	*counts[c.Change]++
	if all || c.Change != "same" {
		d.Rules = append(d.Rules, c)
	}
}

// writeDiff writes the comparison in format to the file out, or to stdout.
func writeDiff(out string, stdout io.Writer, d *reportDiff, format string) error {
	var b bytes.Buffer
	if format == "json" {
		j, err := json.MarshalIndent(d, "", "  ")
		if err != nil {
			return err
		}
		b.Write(append(j, '\n'))
	} else {
		server := func(s diffServer) string {
			return fmt.Sprintf("%s (profile %s, mode %s, world %s)", printable(s.BaseURL), printable(s.Profile), printable(s.Mode), printable(s.World))
		}
		fmt.Fprintf(&b, "OLD %s, NEW %s", server(d.Old), server(d.New))
		if d.Old.Profile != d.New.Profile {
			b.WriteString("; the profiles differ: check diff compares verdicts, so a rule whose profile lets it answer otherwise (404 against 409) is same")
		}
		b.WriteString("\n")
		for i, who := range []string{"OLD", "NEW"} {
			for _, w := range d.warnings[i] {
				fmt.Fprintf(&b, "%s warning: %s\n", who, printable(cutField(w, 4*maxKitField)))
			}
		}
		for _, c := range d.Rules {
			fmt.Fprintf(&b, "%-9s %s  %s -> %s", c.Change, printable(c.ID), cmp.Or(derefOr(c.Old), "-"), cmp.Or(derefOr(c.New), "-"))
			switch {
			case c.Reason != nil:
				fmt.Fprintf(&b, "  %s", printable(cutField(*c.Reason, 4*maxKitField)))
			case c.oldWhy != nil:
				fmt.Fprintf(&b, "  OLD: %s", printable(cutField(*c.oldWhy, 4*maxKitField)))
			}
			b.WriteString("\n")
		}
		s := d.Summary
		fmt.Fprintf(&b, "%d rules: %d same, %d regressed, %d improved, %d changed, %d added, %d removed\n", s.Total, s.Same, s.Regressed, s.Improved, s.Changed, s.Added, s.Removed)
	}
	if out == "" {
		_, err := stdout.Write(b.Bytes())
		return err
	}
	return os.WriteFile(out, b.Bytes(), 0o644)
}

// derefOr is *s, or "" for nil.
func derefOr(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// ===== check: go run . exam, a client of the exam routes for CI =====

// go run . exam is a client of the exam routes, as the kit is of the API: exam list, exam
// start NAME (the 201's JSON, or with -format env the lines a shell evals), exam grade ID
// (polls once a second until the grade is computed; text, json or junit), and exam run NAME
// -- COMMAND, which takes the exam several times with the integrator's own client and
// reports its pass rate. A CI job reads
//
//	sandbox exam run order-sync -attempts 5 -format junit -- ./my-sync > exam.xml
//
// and fails when the integration does. It carries one key, SANDBOX_EXAM_KEY (never a flag,
// so that it is never in a process listing), to the base URL's host only, follows no
// redirect, bounds each request, each answer and each wait, reads every answer into types
// of its own and refuses one that is not of the contract's shape, and writes nothing a
// server sent as it came: keys masked (the attempt's key it prints, a throwaway, aside),
// control characters escaped, JUnit escaped as XML. Every server is treated as the kit
// treats one: as a stranger.

// Exit statuses of go run . exam.
const (
	examPassed      = 0 // the attempt passed (and list and start did their work)
	examFailed      = 1 // the attempt failed
	examCannotGrade = 2 // a usage error, a server that answered otherwise, or no grade in time
)

// examPollGrace is how long past the deadline (times the attempt's scale) exam grade polls
// before it gives up, on the attempt's clock: the 60 s an answer is taken, and 10 s for the
// last reads. examPollBound is its bound by the wall clock, whatever a server's now and
// scale say: the longest exam at the largest scale, and that grace.
const (
	examPollGrace = examAnswerTime + 10*time.Second
	examPollBound = maxExamScale * (examDuration + examPollGrace)
)

// examRunLimits: the most attempts exam run takes, how long it lets a client ended by
// SIGTERM go before SIGKILL, and how often it says what it waits for.
const (
	maxExamAttempts  = 100
	examKillGrace    = 5 * time.Second
	examSayEvery     = 10 // polls between two "waiting" lines: once a second at most, far fewer in practice
	defaultExamRuns  = 5
	examAttemptIDPat = `^exm_[a-z2-7]{20}$`
)

var (
	examAttemptID  = regexp.MustCompile(examAttemptIDPat)
	examAttemptKey = regexp.MustCompile(`^sk_test_[a-z2-7]{32}$`)
	examAccount    = regexp.MustCompile(`^acct_[a-z2-7]{20}$`)
)

// examCommand is what go run . exam is told: its verb and argument, its flags, and exam
// run's command.
type examCommand struct {
	verb, arg string // list; start NAME; grade ID; run NAME
	baseURL   string
	scale     int
	format    string
	key       string
	variants  []int64 // -variant, in the order given
	attempts  int     // exam run's -attempts; 0: not given
	command   []string
	readOnly  bool   // exam lint's -read-only
	revision  int    // exam regrade's -revision; -1: the trace's own
	traceDir  string // exam run's -trace-dir: where each attempt's trace is written; "": none
	baseGiven bool   // -base-url given (exam lint reads the file's own base otherwise)
}

// examFormats are the formats of each verb, its default first.
var examFormats = map[string][]string{"list": {"text", "json"}, "start": {"json", "env"}, "grade": {"text", "json", "junit"}, "run": {"text", "json", "junit"}, "lint": {"text", "json", "junit"}, "regrade": {"text", "json", "junit"}}

// examDeps are what go run . exam takes from its process: its environment, its two outputs,
// a wait between a grade's reads, the wall clock, and how a client's command is started
// (nil: as a process of its own).
type examDeps struct {
	getenv         func(string) string
	stdout, stderr io.Writer
	sleep          func(context.Context, time.Duration) error
	now            func() time.Time
	colour         bool      // standard output is a terminal and NO_COLOR is not set: verdicts in colour
	stdin          io.Reader // what exam lint - reads
}

// colourTerminal reports whether f is a terminal and NO_COLOR is not set (no-color.org):
// what a command writes there may colour its verdicts.
func colourTerminal(f *os.File, getenv func(string) string) bool {
	if getenv("NO_COLOR") != "" {
		return false
	}
	info, err := f.Stat()
	return err == nil && info.Mode()&os.ModeCharDevice != 0
}

// parseExamCommand reads exam's verb, its argument and its flags, which may stand before or
// after the argument, each flag falling back to SANDBOX_EXAM_<NAME>, the key read from
// SANDBOX_EXAM_KEY; exam run's command follows --.
func parseExamCommand(args []string, getenv func(string) string, usage io.Writer) (examCommand, error) {
	c := examCommand{baseURL: defaultBaseURL, scale: 1, revision: -1, key: cmp.Or(getenv("SANDBOX_EXAM_KEY"), "sk_test_sandbox_all")}
	if i := slices.Index(args, "--"); i >= 0 {
		args, c.command = args[:i], args[i+1:]
	}
	intro := "Usage: sandbox exam list | start NAME | grade ID | run NAME [flags] -- COMMAND [ARGS...] | lint FILE | regrade FILE: a client of the sandbox's exams for CI. start prints the attempt (with -format env, SANDBOX_BASE_URL, SANDBOX_KEY, SANDBOX_EXAM and SANDBOX_EXAM_GIVEN for eval); grade polls until the grade is computed; run takes the exam -attempts times with COMMAND as the client and reports its pass rate (pass^k), each check passed, failed or flaky; lint judges any HAR file (- for standard input) by the checks that need no world; regrade judges an attempt's trace (GET /v1/test_helpers/exams/{id}/trace) again with no server, exit 0 when its grade is the one recorded and 1 naming each check that differs. The key is SANDBOX_EXAM_KEY (default sk_test_sandbox_all; grade needs the key that started the attempt); each flag falls back to SANDBOX_EXAM_<NAME>. Exit status: 0 passed, 1 failed, 2 could not grade (or a usage error)."
	fs := c.flagSet()
	var operands []string                      // the verb, then its operand
	for rest := args; ; rest = fs.Args()[1:] { // flags before and after each
		_, err := parseFlags(fs, rest, usage, intro, "exam", "exam -h")
		if err == nil {
			break
		}
		if !strings.HasPrefix(err.Error(), "unexpected argument") {
			return c, err
		}
		operands = append(operands, fs.Arg(0))
	}
	if len(operands) == 0 || examFormats[operands[0]] == nil {
		return c, errors.New("want exam list, exam start NAME, exam grade ID, exam run NAME -- COMMAND, exam lint FILE or exam regrade FILE (see exam -h)")
	}
	c.verb, operands = operands[0], operands[1:]
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if err := fallBack(fs, given, getenv, "SANDBOX_EXAM_"); err != nil {
		return c, err
	}
	c.baseGiven = given["base-url"]
	return c, c.settle(operands, given)
}

// flagSet is exam's flags, each setting c.
func (c *examCommand) flagSet() *flag.FlagSet {
	fs := flag.NewFlagSet("sandbox exam", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Func("base-url", "the sandbox's API base, an absolute http or https `URL` (default "+defaultBaseURL+")", func(v string) (err error) {
		c.baseURL, err = apiBaseURL(v)
		return err
	})
	fs.Func("scale", "exam start and run: every instant of the exam's world times this whole `number`, 1 to 60 (default 1), for a client that works slowly", func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxExamScale {
			return fmt.Errorf("want a whole number from 1 to %d", maxExamScale)
		}
		c.scale = n
		return nil
	})
	fs.Func("variant", "exam start and run: the world to draw, a whole `number` from 0 to 2147483647 (default: drawn at random); exam run takes it again for each -variant, in order", func(v string) error {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || n > math.MaxInt32 {
			return errors.New("want a whole number from 0 to 2147483647")
		}
		c.variants = append(c.variants, n)
		return nil
	})
	fs.Func("attempts", fmt.Sprintf("exam run: how many attempts, one after another, a whole `number` from 1 to %d (default %d, or the count of -variant)", maxExamAttempts, defaultExamRuns), func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxExamAttempts {
			return fmt.Errorf("want a whole number from 1 to %d", maxExamAttempts)
		}
		c.attempts = n
		return nil
	})
	fs.StringVar(&c.format, "format", "", "list: `text` or json; start: json or env (lines for eval); grade, run, lint and regrade: text, json or junit (default: the first)")
	fs.BoolVar(&c.readOnly, "read-only", false, "exam lint: judge lint.read_only (the client was to only read)")
	fs.Func("revision", "exam regrade: judge the trace by this `revision` of its exam, one this binary holds (default: the trace's own); checks are then matched by id", func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return errors.New("want a whole number from 1")
		}
		c.revision = n
		return nil
	})
	fs.StringVar(&c.traceDir, "trace-dir", "", "exam run: write each attempt's trace, once graded, to `DIR`/ID.har (the directory made if missing)")
	return fs
}

// settle judges what holds between exam's verb, its operands and its flags.
func (c *examCommand) settle(operands []string, given map[string]bool) error {
	want := map[string]string{"list": "", "start": "NAME", "grade": "ID", "run": "NAME", "lint": "FILE", "regrade": "FILE"}[c.verb]
	switch {
	case want == "" && len(operands) > 0:
		return fmt.Errorf("exam list takes no argument, not %q", operands[0])
	case want != "" && len(operands) != 1:
		return fmt.Errorf("exam %s takes one %s, given %d", c.verb, want, len(operands))
	}
	if err := c.flagsFault(given); err != nil {
		return err
	}
	if c.verb == "run" && c.attempts == 0 {
		c.attempts = cmp.Or(len(c.variants), defaultExamRuns)
	}
	if len(operands) == 1 {
		c.arg = operands[0]
	}
	formats := examFormats[c.verb]
	if c.format == "" {
		c.format = formats[0]
	}
	if !slices.Contains(formats, c.format) {
		return fmt.Errorf("-format: exam %s writes %s", c.verb, strings.Join(formats, " or "))
	}
	return nil
}

// flagsFault is what is wrong between exam's verb and the flags given, or nil.
func (c *examCommand) flagsFault(given map[string]bool) error {
	switch {
	case given["scale"] && c.verb != "start" && c.verb != "run":
		return errors.New("-scale is exam start's and exam run's")
	case len(c.variants) > 0 && c.verb != "start" && c.verb != "run":
		return errors.New("-variant is exam start's and exam run's")
	case len(c.variants) > 1 && c.verb == "start":
		return errors.New("exam start takes one -variant")
	case c.attempts > 0 && c.verb != "run":
		return errors.New("-attempts is exam run's")
	case given["read-only"] && c.verb != "lint":
		return errors.New("-read-only is exam lint's")
	case given["revision"] && c.verb != "regrade":
		return errors.New("-revision is exam regrade's")
	case given["trace-dir"] && c.verb != "run":
		return errors.New("-trace-dir is exam run's")
	case kitKeyFault(c.key) != nil:
		return fmt.Errorf("SANDBOX_EXAM_KEY: %v", kitKeyFault(c.key))
	}
	return c.commandFault()
}

// commandFault is what is wrong between exam run and its command, or nil.
func (c *examCommand) commandFault() error {
	switch {
	case c.verb == "run" && len(c.command) == 0:
		return errors.New("exam run takes the client's command after --: exam run NAME [flags] -- COMMAND [ARGS...]")
	case c.verb != "run" && c.command != nil:
		return errors.New("only exam run takes a command after --")
	case c.verb == "run" && c.attempts > 0 && c.attempts < len(c.variants):
		return fmt.Errorf("-attempts %d is fewer than the %d variants asked for", c.attempts, len(c.variants))
	}
	return nil
}

// runExam is go run . exam: it does the verb, writes what it asks for to stdout and why it
// could not to stderr, and returns the exit status.
func runExam(ctx context.Context, args []string, deps examDeps) int {
	c, err := parseExamCommand(args, deps.getenv, deps.stdout)
	secrets := newSecrets(map[string]string{"SANDBOX_EXAM_KEY": c.key})
	errs := &examSaying{w: deps.stderr, secrets: secrets}
	switch {
	case errors.Is(err, flag.ErrHelp):
		return examPassed
	case err != nil:
		errs.say(err.Error())
		return examCannotGrade
	}
	client := &examClient{base: c.baseURL, key: c.key, secrets: secrets, deps: deps, errs: errs,
		http: &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	var out []byte
	status := examPassed
	switch c.verb {
	case "list":
		out, err = client.list(ctx, c.format)
	case "start":
		var x *examAttemptOut
		if x, err = client.start(ctx, c.arg, c.scale, c.variants); err == nil {
			out = client.startWritten(x, c.format)
		}
	case "grade":
		var g *examGradeOut
		if g, err = client.grade(ctx, c.arg); err == nil {
			out, status = client.gradeWritten(g, c.format), map[bool]int{true: examPassed, false: examFailed}[*g.Passed]
		}
	case "run":
		var rep *examRunReport
		rep, status = client.run(ctx, c)
		out = rep.written(c.format, client)
	case "lint":
		out, status, err = client.lintFile(c, deps.stdin)
	case "regrade":
		out, status, err = client.regradeFile(c, deps.stdin)
	}
	if err != nil {
		errs.say(err.Error())
		return examCannotGrade
	}
	if _, err := deps.stdout.Write(out); err != nil {
		errs.say("writing: " + err.Error())
		return examCannotGrade
	}
	return status
}

// examSaying writes exam's lines for a person on standard error, each masked and made
// printable, under a lock (exam run's clients write beside it).
type examSaying struct {
	mu      sync.Mutex
	w       io.Writer
	secrets *secrets
}

func (s *examSaying) say(text string) { s.line("sandbox exam: " + text) }

// raw writes a line of the client's own output as it wrote it: the integrator's text, not a
// server's.
func (s *examSaying) raw(text string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintln(s.w, text)
}

func (s *examSaying) line(text string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintln(s.w, printable(s.secrets.mask(text)))
}

// examClient carries exam's requests to the base URL, with its one key.
type examClient struct {
	base, key string
	secrets   *secrets
	http      *http.Client
	deps      examDeps
	errs      *examSaying
}

// maxExamAnswer is the most of an answer exam reads.
const maxExamAnswer = 1 << 20

// call sends one request (a body, with an Idempotency-Key of its own, for a POST) and returns
// the answer's body when its status is want; any other answer is an error that says it.
func (e *examClient) call(ctx context.Context, method, path, body string, want int) ([]byte, error) {
	var rb io.Reader
	if body != "" {
		rb = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, e.base+path, rb)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+e.key)
	if body != "" {
		req.Header.Set("Content-Type", jsonContentType)
		idem := make([]byte, 12)
		rand.Read(idem)
		req.Header.Set("Idempotency-Key", fmt.Sprintf("exam-%x", idem))
	}
	res, err := e.http.Do(req)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("%s %s: connection refused: is the sandbox running at %s? (start it with go run ., or pass -base-url)", method, e.base+path, e.base)
		}
		return nil, fmt.Errorf("%s %s: %v", method, e.base+path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, maxExamAnswer+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("%s %s: reading the answer: %v", method, e.base+path, err)
	case len(b) > maxExamAnswer:
		return nil, fmt.Errorf("%s %s: an answer over %d bytes", method, e.base+path, maxExamAnswer)
	case res.StatusCode != want:
		var p struct{ Code, Detail, Param string }
		if json.Unmarshal(b, &p) == nil && p.Code != "" {
			if p.Param != "" {
				p.Code += " (" + p.Param + ")"
			}
			return nil, fmt.Errorf("%s %s answered %d %s: %s", method, e.base+path, res.StatusCode, cutField(p.Code, 128), cutField(p.Detail, 512))
		}
		return nil, fmt.Errorf("%s %s answered %d, not %d: is %s the sandbox's API base?", method, e.base+path, res.StatusCode, want, e.base)
	}
	return b, nil
}

// inert is a server's text as exam writes it in JSON: keys masked (but keep, the attempt's
// own key exam prints); the JSON writer then escapes what is not printable.
func (e *examClient) inert(s, keep string) string {
	if s == keep && keep != "" {
		return s
	}
	return e.secrets.mask(s)
}

// inertText is a server's text as exam writes it for a person: masked, and made printable.
func (e *examClient) inertText(s string) string { return printable(e.secrets.mask(s)) }

// examListOut is the catalogue as exam reads it.
type examListOut struct {
	Data []struct {
		Name            string `json:"name"`
		Revision        int    `json:"revision"`
		Title           string `json:"title"`
		Task            string `json:"task"`
		DurationSeconds int    `json:"duration_seconds"`
		Checks          []struct {
			ID string `json:"id"`
		} `json:"checks"`
	} `json:"data"`
}

// list is exam list: the catalogue, as the server wrote it (json, cleaned) or for a person
// (text).
func (e *examClient) list(ctx context.Context, format string) ([]byte, error) {
	b, err := e.call(ctx, http.MethodGet, "/test_helpers/exams", "", http.StatusOK)
	var l examListOut
	if err == nil && (json.Unmarshal(b, &l) != nil || len(l.Data) == 0) {
		err = errors.New("GET /test_helpers/exams: an answer that is not the catalogue")
	}
	if err != nil {
		return nil, err
	}
	if format == "json" {
		return cleanJSON(b, func(s string) string { return e.inert(s, "") })
	}
	var out strings.Builder
	for _, x := range l.Data {
		var checks []string
		for _, c := range x.Checks {
			checks = append(checks, e.inertText(c.ID))
		}
		fmt.Fprintf(&out, "%s (revision %d, %d s): %s\n  %s\n  checks: %s\n", e.inertText(x.Name), x.Revision, x.DurationSeconds, e.inertText(x.Title), e.inertText(x.Task), strings.Join(checks, ", "))
	}
	return []byte(out.String()), nil
}

// examAttemptOut is an attempt's start as exam reads it, and the answer it read it from.
type examAttemptOut struct {
	ID        string          `json:"id"`
	Exam      string          `json:"exam"`
	Revision  int             `json:"revision"`
	Variant   int64           `json:"variant"`
	Scale     int             `json:"scale"`
	Account   string          `json:"account"`
	Key       string          `json:"key"`
	StartedAt string          `json:"started_at"`
	Deadline  string          `json:"deadline"`
	Task      string          `json:"task"`
	Given     json.RawMessage `json:"given"`
	raw       []byte
}

// start is exam start: an attempt of exam made, read as the contract's shape: an attempt id,
// an account and a throwaway key of their forms (never the caller's key), a scale of 1 to 60,
// a variant, instants, and what the task gives (a JSON object).
func (e *examClient) start(ctx context.Context, exam string, scale int, variants []int64) (*examAttemptOut, error) {
	ask := map[string]any{"exam": exam, "scale": scale}
	if len(variants) > 0 {
		ask["variant"] = variants[0]
	}
	body, _ := json.Marshal(ask)
	b, err := e.call(ctx, http.MethodPost, "/test_helpers/exams", string(body), http.StatusCreated)
	if err != nil {
		return nil, err
	}
	x := &examAttemptOut{raw: b}
	if json.Unmarshal(b, x) != nil || !examAttemptID.MatchString(x.ID) || !examAttemptKey.MatchString(x.Key) || x.Key == e.key || !examAccount.MatchString(x.Account) ||
		x.Scale < 1 || x.Scale > maxExamScale || x.Variant < 0 || x.Variant > math.MaxInt32 || !isJSONObject(x.Given) || x.Exam != exam {
		return nil, errors.New("POST /test_helpers/exams: an answer that is not an attempt of the contract's shape (an attempt's id, a throwaway test key of its own, a scale of 1 to 60, a variant, what the task gives)")
	}
	if _, err := time.Parse(time.RFC3339Nano, x.StartedAt); err != nil {
		return nil, errors.New("POST /test_helpers/exams: an attempt without its started_at")
	}
	return x, nil
}

// isJSONObject reports whether b is one JSON object.
func isJSONObject(b json.RawMessage) bool {
	var m map[string]json.RawMessage
	return json.Unmarshal(b, &m) == nil && m != nil
}

// givenLine is what an attempt's task gives, as compact JSON, cleaned.
func (e *examClient) givenLine(x *examAttemptOut) string {
	b, err := cleanJSON(x.Given, func(s string) string { return e.inert(s, "") })
	if err != nil {
		return "{}"
	}
	return strings.TrimSuffix(string(b), "\n")
}

// startWritten is an attempt as exam start writes it: its JSON, cleaned (the attempt's own key
// kept), or the lines a shell evals, each value shell-quoted and free of control characters.
func (e *examClient) startWritten(x *examAttemptOut, format string) []byte {
	if format == "json" {
		b, err := cleanJSON(x.raw, func(s string) string { return e.inert(s, x.Key) })
		if err != nil {
			return nil
		}
		return b
	}
	return []byte("SANDBOX_BASE_URL=" + shellQuote(e.base) + "\nSANDBOX_KEY=" + shellQuote(x.Key) + "\nSANDBOX_EXAM=" + shellQuote(x.ID) + "\nSANDBOX_EXAM_GIVEN=" + shellQuote(e.givenLine(x)) + "\n")
}

// examGradeOut is a grade as exam reads it, and the answer it read it from.
type examGradeOut struct {
	ID       string         `json:"id"`
	Exam     string         `json:"exam"`
	Revision int            `json:"revision"`
	Variant  int64          `json:"variant"`
	Scale    int            `json:"scale"`
	State    string         `json:"state"`
	Now      string         `json:"now"`
	Deadline string         `json:"deadline"`
	GradedAt *string        `json:"graded_at"`
	Passed   *bool          `json:"passed"`
	Score    *string        `json:"score"`
	Checks   []examCheckOut `json:"checks"`
	raw      []byte
	now      time.Time // Now and Deadline, read
	deadline time.Time
}

type examCheckOut struct {
	ID       string   `json:"id"`
	Result   string   `json:"result"`
	Detail   *string  `json:"detail"`
	Requests []uint64 `json:"requests"`
	MarginMS *int64   `json:"margin_ms"`
}

var examScore = regexp.MustCompile(`^\d{1,3}/\d{1,3}$`)

// readGrade reads a grade as the contract's shape: an attempt id, a scale of 1 to 60, its
// instants, a state, each check's result; once graded, passed and score agreeing with them.
func readGrade(b []byte) (*examGradeOut, error) {
	g := &examGradeOut{raw: b}
	var errNow, errDeadline error
	if json.Unmarshal(b, g) == nil {
		g.now, errNow = time.Parse(time.RFC3339Nano, g.Now)
		g.deadline, errDeadline = time.Parse(time.RFC3339Nano, g.Deadline)
	}
	switch {
	case g.raw == nil || !examAttemptID.MatchString(g.ID) || g.Exam == "":
		return nil, errors.New("an answer that is not a grade")
	case g.Scale < 1 || g.Scale > maxExamScale:
		return nil, fmt.Errorf("a grade of scale %d, outside 1 to %d", g.Scale, maxExamScale)
	case errNow != nil || errDeadline != nil:
		return nil, errors.New("a grade without its now and deadline")
	case !slices.Contains([]string{"running", "awaiting_answer", "graded"}, g.State) || len(g.Checks) == 0:
		return nil, errors.New("a grade without its state or its checks")
	}
	if err := g.checksAgree(); err != nil {
		return nil, err
	}
	return g, nil
}

// checksAgree reports whether a grade's checks are each pending while it runs and passed or
// failed (a failure with its sentence) once graded, and its passed and score say the same.
func (g *examGradeOut) checksAgree() error {
	passes := 0
	for _, c := range g.Checks {
		want := "pending"
		if g.State == "graded" {
			want = map[bool]string{true: "fail", false: "pass"}[c.Result == "fail"]
		}
		if c.ID == "" || c.Result != want || (c.Result == "fail") != (c.Detail != nil) {
			return fmt.Errorf("a grade whose check %q reads %q", cutField(c.ID, 64), cutField(c.Result, 16))
		}
		if c.Result == "pass" {
			passes++
		}
	}
	if g.State == "graded" && (g.Passed == nil || g.Score == nil || *g.Passed != (passes == len(g.Checks)) || *g.Score != fmt.Sprintf("%d/%d", passes, len(g.Checks)) || !examScore.MatchString(*g.Score)) {
		return errors.New("a graded grade whose passed and score do not agree with its checks")
	}
	return nil
}

// grade is exam grade: the grade read once a second until it is computed, and said on
// standard error while it waits; no grade when its now passes the deadline by examPollGrace
// times its scale, or by the wall clock once examPollBound has passed.
func (e *examClient) grade(ctx context.Context, id string) (*examGradeOut, error) {
	path := "/test_helpers/exams/" + url.PathEscape(id)
	began, state := e.deps.now(), ""
	for polls := 0; ; polls++ {
		b, err := e.call(ctx, http.MethodGet, path, "", http.StatusOK)
		if err != nil {
			return nil, err
		}
		g, err := readGrade(b)
		switch {
		case err != nil:
			return nil, fmt.Errorf("GET %s: %v", path, err)
		case g.State == "graded":
			return g, nil
		case g.now.After(g.deadline.Add(examPollGrace * time.Duration(g.Scale))):
			return nil, fmt.Errorf("the grade of %s was not computed by %s, %v after its deadline (both on the attempt's clock): is the sandbox's clock running?", g.ID, g.Now, examPollGrace*time.Duration(g.Scale))
		case e.deps.now().Sub(began) > examPollBound:
			return nil, fmt.Errorf("the grade of %s was not computed in %v of polling (the longest an exam at scale %d takes): is the sandbox's clock running?", g.ID, examPollBound, maxExamScale)
		}
		if g.State != state || polls%examSayEvery == 0 {
			e.errs.say(fmt.Sprintf("waiting for the grade of %s: %s, %s on the attempt's clock, deadline %s (graded at the answer, or %v after the deadline without one)", g.ID, strings.ReplaceAll(g.State, "_", " "), g.Now, g.Deadline, examAnswerTime*time.Duration(g.Scale)))
			state = g.State
		}
		if err := e.deps.sleep(ctx, time.Second); err != nil {
			return nil, fmt.Errorf("interrupted before the grade of %s was computed (state %s)", g.ID, g.State)
		}
	}
}

// gradeWritten is a computed grade in format: its JSON, cleaned; JUnit, written by exam from
// what it read; or for a person (text).
func (e *examClient) gradeWritten(g *examGradeOut, format string) []byte {
	switch format {
	case "json":
		b, _ := cleanJSON(g.raw, func(s string) string { return e.inert(s, "") })
		return b
	case "junit":
		return e.gradeJUnit(g).xml()
	}
	var out strings.Builder
	verdict := "FAILED"
	if *g.Passed {
		verdict = "passed"
	}
	fmt.Fprintf(&out, "exam %s %s (revision %d, variant %d, scale %d): %s, %s\n", e.inertText(g.Exam), g.ID, g.Revision, g.Variant, g.Scale, verdict, *g.Score)
	for _, ch := range g.Checks {
		fmt.Fprintf(&out, "  %s %s", e.colour(strings.ToUpper(ch.Result)), e.inertText(ch.ID))
		if ch.Detail != nil {
			fmt.Fprintf(&out, ": %s", e.inertText(*ch.Detail))
		}
		if ch.MarginMS != nil {
			fmt.Fprintf(&out, " (margin %d ms)", *ch.MarginMS)
		}
		if len(ch.Requests) > 0 {
			fmt.Fprintf(&out, " (%s)", entriesCited(ch.Requests))
		}
		out.WriteString("\n")
	}
	return []byte(out.String())
}

// gradeJUnit is a grade as a JUnit report, exam's own writing of what it read.
func (e *examClient) gradeJUnit(g *examGradeOut) junitReport {
	suite := junitReport{name: "exam " + e.inert(g.Exam, "") + " " + g.ID,
		properties: [][2]string{{"exam", e.inert(g.Exam, "")}, {"revision", strconv.Itoa(g.Revision)}, {"variant", strconv.FormatInt(g.Variant, 10)}, {"scale", strconv.Itoa(g.Scale)}}}
	for _, c := range g.Checks {
		jc := junitTest{class: "exam." + e.inert(g.Exam, ""), name: e.inert(c.ID, ""), result: c.Result}
		if c.Result == "fail" {
			jc.message, jc.body = e.inert(*c.Detail, ""), cmp.Or(entriesCited(c.Requests), "no journal entry cited")
		}
		suite.cases = append(suite.cases, jc)
	}
	return suite
}

// colour is a verdict coloured for a terminal: never when NO_COLOR is set or standard output
// is not a terminal.
func (e *examClient) colour(verdict string) string {
	word := fmt.Sprintf("%-5s", verdict)
	if !e.deps.colour {
		return word
	}
	code := map[string]string{"PASS": "32", "FAIL": "31", "FLAKY": "33"}[verdict]
	if code == "" {
		return word
	}
	return "\x1b[" + code + "m" + word + "\x1b[0m"
}

// cleanJSON is the JSON b, compact, its members in their order, every string passed through
// clean and written with every character printable would escape escaped (\uXXXX): what a
// server sent, made inert for a terminal or a file.
func cleanJSON(b []byte, clean func(string) string) ([]byte, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var out bytes.Buffer
	if err := cleanValue(d, &out, clean); err != nil {
		return nil, err
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, errors.New("data after the JSON value")
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}

// cleanValue writes the next JSON value of d to out, cleaned as cleanJSON says.
func cleanValue(d *json.Decoder, out *bytes.Buffer, clean func(string) string) error {
	tok, err := d.Token()
	if err != nil {
		return err
	}
	switch v := tok.(type) {
	case json.Delim:
		out.WriteByte(byte(v))
		for i := 0; d.More(); i++ {
			if i > 0 {
				out.WriteByte(',')
			}
			if v == '{' {
				name, err := d.Token()
				if err != nil {
					return err
				}
				out.WriteString(inertJSONString(clean(name.(string))) + ":")
			}
			if err := cleanValue(d, out, clean); err != nil {
				return err
			}
		}
		end, err := d.Token()
		if err != nil {
			return err
		}
		out.WriteByte(byte(end.(json.Delim)))
	case string:
		out.WriteString(inertJSONString(clean(v)))
	case json.Number:
		out.WriteString(v.String())
	case bool:
		out.WriteString(strconv.FormatBool(v))
	case nil:
		out.WriteString("null")
	}
	return nil
}

// inertJSONString is s as a JSON string whose every character printable would escape is
// written \uXXXX (a control, a line separator, a bidirectional control, U+FFFE), the quote and
// backslash escaped.
func inertJSONString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range strings.ToValidUTF8(s, "\ufffd") {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r > 0xffff:
			b.WriteRune(r)
		case printable(string(r)) != string(r) || r == '<' || r == '>' || r == '&':
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// sleepFor waits d, or until ctx is done.
func sleepFor(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ===== check: exam run, an exam taken several times with the client's own command =====

// exam run takes an exam -attempts times, one attempt after another, each with the
// integrator's own client (COMMAND: no shell, standard input empty, a process group of its
// own, the attempt in its environment), ends a client still running at its attempt's
// grading limit, grades each attempt as exam grade does, and reports the pass rate: pass^k
// (τ-bench's estimator, the chance that k attempts drawn from those graded all passed), each
// check passed in every attempt, failed in every one or flaky, and the smallest margin.

// examRunAttempt is one attempt of exam run: how it went.
type examRunAttempt struct {
	x        *examAttemptOut
	grade    *examGradeOut
	exitCode *int    // the client's exit status; nil when it was ended (at the limit, or by a signal)
	seconds  float64 // from the client's start to its end
	fault    string  // why it could not be started, run or graded; "" when graded
	// traceFault: why its trace could not be written under -trace-dir ("" when it was, or
	// none was asked for): exam run then ends with status 2, its grades reported.
	traceFault string
}

// examRunReport is what exam run found: the exam, and its attempts in their order.
type examRunReport struct {
	exam, fault string // fault: why exam run stopped early (interrupted), "" otherwise
	revision    int
	scale       int
	attempts    []examRunAttempt
}

// run is exam run: its attempts, one after another, then the report and its exit status.
func (e *examClient) run(ctx context.Context, c examCommand) (*examRunReport, int) {
	rep := &examRunReport{exam: c.arg, scale: c.scale}
	for i := range c.attempts {
		var variants []int64
		if i < len(c.variants) {
			variants = c.variants[i : i+1]
		}
		a := e.runAttempt(ctx, c, i+1, variants)
		rep.attempts = append(rep.attempts, a)
		if a.grade != nil {
			rep.revision = a.grade.Revision
		}
		e.errs.line(a.line(i+1, c.attempts))
		if ctx.Err() != nil {
			rep.fault = "interrupted: the attempts graded so far are reported"
			break
		}
	}
	status, traced := examPassed, true
	for _, a := range rep.attempts {
		switch {
		case a.grade == nil:
			return rep, examCannotGrade
		case !*a.grade.Passed:
			status = examFailed
		}
		traced = traced && a.traceFault == ""
	}
	if rep.fault != "" || !traced {
		return rep, examCannotGrade
	}
	return rep, status
}

// runAttempt starts an attempt, runs the client with it until it exits (or ends it at the
// grading limit), and grades it.
func (e *examClient) runAttempt(ctx context.Context, c examCommand, n int, variants []int64) examRunAttempt {
	x, err := e.start(ctx, c.arg, c.scale, variants)
	if err != nil {
		return examRunAttempt{fault: "could not be started: " + err.Error()}
	}
	a := examRunAttempt{x: x}
	cmd := exec.Command(c.command[0], c.command[1:]...)
	cmd.Env = append(slices.DeleteFunc(os.Environ(), func(v string) bool { return strings.HasPrefix(v, "SANDBOX_EXAM_KEY=") }), // the client has the attempt's key, not the one that starts attempts
		"SANDBOX_BASE_URL="+e.base, "SANDBOX_KEY="+x.Key, "SANDBOX_EXAM="+x.ID, "SANDBOX_EXAM_GIVEN="+e.givenLine(x))
	cmd.Stdin = nil // empty: /dev/null
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out := &prefixedLines{prefix: fmt.Sprintf("[attempt %d] ", n), to: e.errs}
	cmd.Stdout, cmd.Stderr = out, out
	began := e.deps.now()
	if err := cmd.Start(); err != nil {
		a.fault = fmt.Sprintf("its command could not be run: %v", err)
		return a
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	ended, err := e.awaitClient(ctx, x, cmd, exited)
	out.flush()
	a.seconds = e.deps.now().Sub(began).Seconds()
	if code := cmd.ProcessState.ExitCode(); !ended && code >= 0 {
		a.exitCode = &code
	}
	if err != nil {
		a.fault = err.Error()
		return a
	}
	if a.grade, err = e.grade(ctx, x.ID); err != nil {
		a.fault = "could not be graded: " + err.Error()
	}
	if a.grade != nil && c.traceDir != "" {
		if err := e.keepTrace(ctx, x.ID, c.traceDir); err != nil {
			a.traceFault = err.Error()
			e.errs.say(fmt.Sprintf("attempt %s: its trace could not be written: %v", x.ID, err))
		}
	}
	return a
}

// keepTrace writes the trace of the graded attempt id to dir/ID.har (dir made if missing),
// whole or not at all: read into a file of its own beside it, then renamed.
func (e *examClient) keepTrace(ctx context.Context, id, dir string) error {
	if filepath.Base(id) != id || !strings.HasPrefix(id, "exm_") {
		return fmt.Errorf("%q is no attempt's id", id)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.base+"/test_helpers/exams/"+id+"/trace", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+e.key)
	client := *e.http
	client.Timeout = 2 * time.Minute // a trace of 20,000 entries is some 30 MiB
	res, err := client.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s/test_helpers/exams/%s/trace answered %d", e.base, id, res.StatusCode)
	}
	f, err := os.CreateTemp(dir, id+".har.*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if err := f.Chmod(0o644); err != nil { // an artifact, as a file the job writes is
		f.Close()
		return err
	}
	n, err := io.Copy(f, io.LimitReader(res.Body, maxLintFile+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	switch {
	case err != nil:
		return err
	case n > maxLintFile:
		return fmt.Errorf("a trace over %d MiB", maxLintFile>>20)
	}
	return os.Rename(f.Name(), filepath.Join(dir, id+".har"))
}

// awaitClient waits for the client to exit, reading the attempt's grade once a second (the
// reads are free) to end the client's process group at the grading limit (SIGTERM, then
// SIGKILL examKillGrace later), saying so; or at an interrupt. It reports whether it ended
// the client.
func (e *examClient) awaitClient(ctx context.Context, x *examAttemptOut, cmd *exec.Cmd, exited chan error) (bool, error) {
	path := "/test_helpers/exams/" + url.PathEscape(x.ID)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	began := e.deps.now()
	for {
		select {
		case <-exited:
			return false, nil
		case <-ctx.Done():
			endGroup(cmd, exited)
			return true, errors.New("interrupted: its client was ended")
		case <-tick.C:
		}
		limit := false
		if b, err := e.call(ctx, http.MethodGet, path, "", http.StatusOK); err == nil {
			if g, err := readGrade(b); err == nil && !g.now.Before(g.deadline.Add(examAnswerTime*time.Duration(g.Scale))) {
				limit = true
			}
		}
		if limit || e.deps.now().Sub(began) > examPollBound {
			e.errs.say(fmt.Sprintf("attempt %s reached its grading limit (%v after its deadline) with its client still running: ending it (SIGTERM, then SIGKILL %v later)", x.ID, examAnswerTime*time.Duration(x.Scale), examKillGrace))
			endGroup(cmd, exited)
			return true, nil
		}
	}
}

// endGroup ends the client's process group: SIGTERM, then SIGKILL examKillGrace later if it
// has not exited.
func endGroup(cmd *exec.Cmd, exited chan error) {
	pgid := -cmd.Process.Pid
	syscall.Kill(pgid, syscall.SIGTERM)
	var err error
	select {
	case err = <-exited:
	case <-time.After(examKillGrace):
		syscall.Kill(pgid, syscall.SIGKILL)
		err = <-exited // its state is read once Wait is done with it
	}
	syscall.Kill(pgid, syscall.SIGKILL) // what the group left behind
	exited <- err
}

// prefixedLines writes a client's output to exam's standard error, line by line, each
// prefixed with its attempt.
type prefixedLines struct {
	mu     sync.Mutex
	prefix string
	to     *examSaying
	part   []byte
}

func (p *prefixedLines) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.part = append(p.part, b...)
	for {
		i := bytes.IndexByte(p.part, '\n')
		if i < 0 {
			break
		}
		p.to.raw(p.prefix + string(p.part[:i]))
		p.part = p.part[i+1:]
	}
	if len(p.part) > 64<<10 { // a line that never ends is written in pieces
		p.to.raw(p.prefix + string(p.part))
		p.part = nil
	}
	return len(b), nil
}

func (p *prefixedLines) flush() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.part) > 0 {
		p.to.raw(p.prefix + string(p.part))
		p.part = nil
	}
}

// line is the attempt's line on standard error: attempt I of N exm_... variant V: passed
// 11/11, or failed 9/11: the checks failed; with the client's exit status and seconds.
func (a examRunAttempt) line(i, n int) string {
	head := fmt.Sprintf("attempt %d of %d", i, n)
	if a.x != nil {
		head += fmt.Sprintf(" %s variant %d", a.x.ID, a.x.Variant)
	}
	exit := "ended at its limit"
	if a.exitCode != nil {
		exit = fmt.Sprintf("exit %d", *a.exitCode)
	}
	tail := fmt.Sprintf(" (client %s, %.1f s)", exit, a.seconds)
	switch {
	case a.grade == nil && a.x == nil:
		return head + ": " + a.fault
	case a.grade == nil:
		return head + ": " + a.fault + tail
	case *a.grade.Passed:
		return head + ": passed " + *a.grade.Score + tail
	}
	return head + ": failed " + *a.grade.Score + ": " + strings.Join(a.failed(), ", ") + tail
}

// failed are the checks the attempt's grade failed, in its order.
func (a examRunAttempt) failed() []string {
	ids := []string{}
	if a.grade != nil {
		for _, c := range a.grade.Checks {
			if c.Result == "fail" {
				ids = append(ids, c.ID)
			}
		}
	}
	return ids
}

// passK is pass^k for k = 1..n: C(c,k)/C(n,k), c the attempts passed of the n graded.
func passK(c, n int) []float64 {
	out := make([]float64, n)
	for k := 1; k <= n; k++ {
		p := 1.0
		for j := 0; j < k; j++ { // C(c,k)/C(n,k) = prod (c-j)/(n-j)
			p *= float64(c-j) / float64(n-j)
		}
		out[k-1] = max(0, p)
	}
	return out
}

// examRunCheck is a check across the attempts graded: its state, its counts, its smallest
// margin, and the attempts it failed in.
type examRunCheck struct {
	ID          string          `json:"id"`
	State       string          `json:"state"`
	Passed      int             `json:"passed"`
	Failed      int             `json:"failed"`
	MinMarginMS *int64          `json:"min_margin_ms"`
	FailedIn    []examRunFailed `json:"failed_in"`
}

type examRunFailed struct {
	ID      string `json:"id"`
	Variant int64  `json:"variant"`
	Detail  string `json:"detail"`
}

type examRunAttemptJSON struct {
	ID       string   `json:"id"`
	Variant  int64    `json:"variant"`
	Passed   bool     `json:"passed"`
	Score    string   `json:"score"`
	Failed   []string `json:"failed"`
	ExitCode *int     `json:"exit_code"`
	Seconds  float64  `json:"seconds"`
}

// examRunJSON is exam run's report as JSON, its members in this order.
type examRunJSON struct {
	Exam     string               `json:"exam"`
	Revision int                  `json:"revision"`
	Scale    int                  `json:"scale"`
	N        int                  `json:"n"`
	Passed   int                  `json:"passed"`
	PassK    []float64            `json:"pass_k"`
	Checks   []examRunCheck       `json:"checks"`
	Attempts []examRunAttemptJSON `json:"attempts"`
	Faults   []string             `json:"faults,omitempty"`
}

// summary is the report's figures: the attempts graded, passed, pass^k, each check across
// them (in the first grade's order), and what could not be started, run or graded.
func (r *examRunReport) summary(e *examClient) examRunJSON {
	s := examRunJSON{Exam: r.exam, Revision: r.revision, Scale: r.scale, Checks: []examRunCheck{}, Attempts: []examRunAttemptJSON{}}
	index := map[string]int{}
	for i, a := range r.attempts {
		if a.grade == nil {
			s.Faults = append(s.Faults, fmt.Sprintf("attempt %d: %s", i+1, a.fault))
			continue
		}
		g := a.grade
		s.N++
		if *g.Passed {
			s.Passed++
		}
		s.Attempts = append(s.Attempts, examRunAttemptJSON{ID: g.ID, Variant: g.Variant, Passed: *g.Passed, Score: *g.Score, Failed: a.failed(), ExitCode: a.exitCode, Seconds: math.Round(a.seconds*1000) / 1000})
		for _, c := range g.Checks {
			k, ok := index[c.ID]
			if !ok {
				k, index[c.ID] = len(s.Checks), len(s.Checks)
				s.Checks = append(s.Checks, examRunCheck{ID: e.inert(c.ID, ""), FailedIn: []examRunFailed{}})
			}
			rc := &s.Checks[k]
			if c.Result == "fail" {
				rc.Failed++
				rc.FailedIn = append(rc.FailedIn, examRunFailed{ID: g.ID, Variant: g.Variant, Detail: e.inert(*c.Detail, "")})
			} else {
				rc.Passed++
			}
			if c.MarginMS != nil && (rc.MinMarginMS == nil || *c.MarginMS < *rc.MinMarginMS) {
				m := *c.MarginMS
				rc.MinMarginMS = &m
			}
		}
	}
	for i := range s.Checks {
		c := &s.Checks[i]
		c.State = map[bool]string{true: "pass", false: "fail"}[c.Failed == 0]
		if c.Failed > 0 && c.Passed > 0 {
			c.State = "flaky"
		}
	}
	s.PassK = passK(s.Passed, s.N)
	for k := range s.PassK {
		s.PassK[k] = math.Round(s.PassK[k]*1000) / 1000
	}
	if r.fault != "" {
		s.Faults = append(s.Faults, r.fault)
	}
	return s
}

// written is the report in format: text, JSON or JUnit.
func (r *examRunReport) written(format string, e *examClient) []byte {
	s := r.summary(e)
	switch format {
	case "json":
		b, _ := json.Marshal(s)
		out, _ := cleanJSON(b, func(t string) string { return t })
		return out
	case "junit":
		suite := junitReport{name: fmt.Sprintf("exam %s rev %d x %d", s.Exam, s.Revision, s.N)}
		for k, p := range s.PassK {
			suite.properties = append(suite.properties, [2]string{fmt.Sprintf("pass^%d", k+1), strconv.FormatFloat(p, 'f', 3, 64)})
		}
		for i, a := range s.Attempts {
			suite.properties = append(suite.properties, [2]string{fmt.Sprintf("attempt.%d", i+1), strconv.FormatInt(a.Variant, 10)})
		}
		for _, c := range s.Checks {
			jc := junitTest{class: "exam." + s.Exam, name: c.ID, result: "pass"}
			if c.Failed > 0 {
				var lines []string
				for _, f := range c.FailedIn {
					lines = append(lines, fmt.Sprintf("%s variant %d: %s", f.ID, f.Variant, f.Detail))
				}
				jc.result, jc.message, jc.body = "fail", fmt.Sprintf("failed in %d of %d attempts", c.Failed, s.N), strings.Join(lines, "\n")
			}
			suite.cases = append(suite.cases, jc)
		}
		for _, f := range s.Faults { // an attempt not graded: an error, never green
			suite.cases = append(suite.cases, junitTest{class: "exam." + s.Exam, name: "exam run", result: "error", message: f})
		}
		return suite.xml()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "exam %s revision %d scale %d: %d of %d attempts passed\n", e.inertText(s.Exam), s.Revision, s.Scale, s.Passed, s.N)
	var ks []string
	for k, p := range s.PassK {
		ks = append(ks, fmt.Sprintf("pass^%d %.3f", k+1, p))
	}
	if len(ks) > 0 {
		fmt.Fprintf(&b, "  %s\n", strings.Join(ks, "  "))
	}
	for _, c := range s.Checks {
		fmt.Fprintf(&b, "  %s %s: passed %d, failed %d", e.colour(strings.ToUpper(c.State)), e.inertText(c.ID), c.Passed, c.Failed)
		if c.MinMarginMS != nil {
			fmt.Fprintf(&b, ", smallest margin %d ms", *c.MinMarginMS)
		}
		b.WriteString("\n")
		for _, f := range c.FailedIn {
			fmt.Fprintf(&b, "    failed in %s variant %d: %s\n", f.ID, f.Variant, e.inertText(f.Detail))
		}
	}
	for _, f := range s.Faults {
		fmt.Fprintf(&b, "  ERROR %s\n", e.inertText(f))
	}
	if s.N > 0 {
		fmt.Fprintf(&b, "take a failing variant again: exam run %s -variant V -- COMMAND\n", e.inertText(s.Exam))
	}
	return []byte(b.String())
}

// ===== check: exam lint, the checks that need no world, on any HAR =====

// exam lint judges any HAR 1.2 file, a browser's export, mitmproxy's or one recorded against
// live, with or without the sandbox's _ members: the checks that the requests alone decide
// (retries, cursors, walks, writes, pace, auth loops); every check that needs the world is a
// skip with that reason. It reads the file alone, never sends anything, and writes nothing of
// it as it came: keys masked, control characters escaped.

// lintHAR is a HAR file as exam lint reads it: only what it judges.
type lintHAR struct {
	Log *struct {
		Entries *[]json.RawMessage `json:"entries"`
	} `json:"log"`
}

// lintEntry is one entry of a HAR as exam lint reads it.
type lintEntry struct {
	StartedDateTime string  `json:"startedDateTime"`
	Time            float64 `json:"time"`
	Key             *string `json:"_key"`
	Request         struct {
		Method   string    `json:"method"`
		URL      string    `json:"url"`
		Headers  []harPair `json:"headers"`
		PostData *struct {
			Text *string `json:"text"`
		} `json:"postData"`
	} `json:"request"`
	Response struct {
		Status  *int      `json:"status"`
		Headers []harPair `json:"headers"`
		Content struct {
			Text *string `json:"text"`
		} `json:"content"`
	} `json:"response"`
}

// linted is an entry judged: its place in the file (from 1), its key, method, target (below
// the base URL) and query, its arrival and end, its status, its headers and texts.
type linted struct {
	n              int
	key            string
	method, target string
	path           string
	query          url.Values
	arrived, ended time.Time
	status         int
	retryAfter     time.Duration // -1 when none
	idem           *string
	body, answer   *string
}

// lintCheck is one check's result.
type lintCheck struct {
	ID       string  `json:"id"`
	Result   string  `json:"result"`
	Detail   *string `json:"detail"`
	Requests []int   `json:"requests"`
}

// lintReport is exam lint's report, its members in this order.
type lintReport struct {
	File       string      `json:"file"`
	BaseURL    string      `json:"base_url"`
	Entries    int         `json:"entries"`
	Judged     int         `json:"judged"`
	OtherHosts int         `json:"other_hosts"`
	Unreadable int         `json:"unreadable"`
	Keys       int         `json:"keys"`
	Checks     []lintCheck `json:"checks"`
}

// lintWorldChecks are the checks that need the world: skipped, saying so.
var lintWorldChecks = []string{"answer.orders", "answer.statuses", "answer.links", "answer.consignments", "state.booked", "state.only_fulfilled", "state.in_time",
	"journal.kept_current", "findings.missed_import", "findings.stale_order", "findings.ambiguous_number", "findings.parcel_number_lookup", "journal.complete"}

// lintFile is exam lint FILE (- standard input): its report in the format asked for, and its
// exit status.
func (e *examClient) lintFile(c examCommand, stdin io.Reader) ([]byte, int, error) {
	data, err := readExamFile(c.arg, stdin)
	if err != nil {
		return nil, examCannotGrade, err
	}
	base := ""
	if c.baseGiven {
		base = strings.TrimSuffix(strings.TrimSuffix(c.baseURL, "/v1"), "/")
	}
	rep, err := e.lint(c.arg, data, base, c.readOnly)
	if err != nil {
		return nil, examCannotGrade, err
	}
	out, status := rep.written(c.format, e)
	return out, status, nil
}

// maxLintFile is the largest HAR exam lint reads.
const maxLintFile = 256 << 20

// readBounded is at most n bytes of the file name.
func readBounded(name string, n int64) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, n))
}

// lint is exam lint: the file read, judged, and the report with its exit status; an error for
// a file it cannot read as HAR (no JSON, no log.entries list).
func (e *examClient) lint(name string, data []byte, base string, readOnly bool) (*lintReport, error) {
	var har lintHAR
	if err := json.Unmarshal(data, &har); err != nil || har.Log == nil || har.Log.Entries == nil {
		return nil, errors.New(printable(cutField(name, 256)) + ": not a HAR file (JSON with a log.entries list)")
	}
	rep := &lintReport{File: name, Entries: len(*har.Log.Entries), Checks: []lintCheck{}}
	var entries []lintEntry
	for _, raw := range *har.Log.Entries {
		var le lintEntry
		if json.Unmarshal(raw, &le) != nil {
			le = lintEntry{}
		}
		entries = append(entries, le)
	}
	if base == "" {
		for _, le := range entries {
			if u, err := url.Parse(le.Request.URL); err == nil && strings.HasPrefix(u.Path, "/v1/") {
				base = u.Scheme + "://" + u.Host
				break
			}
		}
	}
	rep.BaseURL = e.inert(base, "")
	judged := e.lintRead(entries, base, rep)
	keys := map[string]bool{}
	for _, l := range judged {
		keys[l.key] = true
	}
	rep.Keys = len(keys)
	rep.Checks = append(rep.Checks, lintRetries(judged), lintBlindRetries(judged), lintCursorFilters(judged), lintWalks(judged), lintReadOnly(judged, readOnly),
		lintPace(judged), lintAuthLoops(judged))
	for _, id := range lintWorldChecks {
		reason := "needs the world"
		rep.Checks = append(rep.Checks, lintCheck{ID: id, Result: "skip", Detail: &reason, Requests: []int{}})
	}
	for i := range rep.Checks {
		if d := rep.Checks[i].Detail; d != nil {
			clean := e.inert(*d, "")
			rep.Checks[i].Detail = &clean
		}
	}
	return rep, nil
}

// lintRead reads the entries under base, each derendered to its path and query below it; the
// others are counted.
func (e *examClient) lintRead(entries []lintEntry, base string, rep *lintReport) []linted {
	var judged []linted
	for i, le := range entries {
		started, err := time.Parse(time.RFC3339Nano, le.StartedDateTime)
		if le.Request.Method == "" || le.Request.URL == "" || le.Response.Status == nil || err != nil {
			rep.Unreadable++
			continue
		}
		rest, ok := strings.CutPrefix(le.Request.URL, base)
		if !ok || base == "" || rest != "" && rest[0] != '/' && rest[0] != '?' {
			rep.OtherHosts++
			continue
		}
		u, err := url.Parse(rest)
		if err != nil {
			rep.Unreadable++
			continue
		}
		l := linted{n: i + 1, method: le.Request.Method, target: rest, path: u.Path, query: u.Query(), arrived: started,
			ended: started.Add(time.Duration(le.Time * float64(time.Millisecond))), status: *le.Response.Status, retryAfter: -1, answer: le.Response.Content.Text}
		l.key = "no key"
		if auth := harHeader(le.Request.Headers, "Authorization"); auth != "" {
			l.key = strings.TrimSpace(strings.TrimPrefix(auth, "Bearer "))
		}
		if le.Key != nil {
			l.key = *le.Key
		}
		if v := harHeader(le.Request.Headers, "Idempotency-Key"); v != "" {
			l.idem = &v
		}
		if le.Request.PostData != nil {
			l.body = le.Request.PostData.Text
		}
		l.retryAfter = retryAfterOf(le.Response.Headers)
		judged = append(judged, l)
		rep.Judged++
	}
	return judged
}

// harHeader is the first value of a header named name (any case), or "".
func harHeader(headers []harPair, name string) string {
	for _, h := range headers {
		if strings.EqualFold(h.Name, name) {
			return h.Value
		}
	}
	return ""
}

// retryAfterOf is an answer's Retry-After: seconds, or an HTTP-date against its Date; -1
// when it has none it can read.
func retryAfterOf(headers []harPair) time.Duration {
	v := harHeader(headers, "Retry-After")
	if v == "" {
		return -1
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	at, err1 := http.ParseTime(v)
	date, err2 := http.ParseTime(harHeader(headers, "Date"))
	if err1 != nil || err2 != nil {
		return -1
	}
	return max(0, at.Sub(date))
}

func lintPass(id string) lintCheck { return lintCheck{ID: id, Result: "pass", Requests: []int{}} }

func lintFail(id, detail string, cited ...int) lintCheck {
	return lintCheck{ID: id, Result: "fail", Detail: &detail, Requests: cited}
}

func lintSkip(id, reason string) lintCheck {
	return lintCheck{ID: id, Result: "skip", Detail: &reason, Requests: []int{}}
}

// lintRetries is retry_too_soon's rule: a request of a key, method and target that arrived
// while an earlier answer's Retry-After ran, counted from that answer's end; each such request
// counted once, whatever the number of answers: a search of the arrivals for each window.
func lintRetries(judged []linted) lintCheck {
	groups := map[string][]int{}
	var order []string
	for i, l := range judged {
		k := l.key + " " + l.method + " " + l.target
		if groups[k] == nil {
			order = append(order, k)
		}
		groups[k] = append(groups[k], i)
	}
	count, first := 0, []int(nil)
	for _, k := range order {
		g := slices.Clone(groups[k])
		slices.SortStableFunc(g, func(a, b int) int { return judged[a].arrived.Compare(judged[b].arrived) })
		type window struct {
			from, until time.Time
			a           int
		}
		var windows []window
		for _, a := range groups[k] { // in the file's order
			A := &judged[a]
			if A.retryAfter < 0 {
				continue
			}
			from := A.ended
			if !from.After(A.arrived) {
				from = A.arrived.Add(1) // never a retry of itself
			}
			windows = append(windows, window{from, A.ended.Add(A.retryAfter), a})
		}
		search := func(at time.Time) int {
			x, _ := slices.BinarySearchFunc(g, at, func(i int, at time.Time) int { return judged[i].arrived.Compare(at) })
			return x
		}
		for _, w := range windows { // the first answer, in the file's order, with a request in its window
			if x := search(w.from); first == nil && x < len(g) && judged[g[x]].arrived.Before(w.until) {
				first = []int{judged[w.a].n, judged[g[x]].n}
			}
		}
		slices.SortFunc(windows, func(a, b window) int { return a.from.Compare(b.from) })
		reach := 0 // the arrivals before it are counted, or before every window
		for _, w := range windows {
			for x := max(reach, search(w.from)); x < len(g) && judged[g[x]].arrived.Before(w.until); x++ {
				count++
				reach = x + 1
			}
		}
	}
	if count == 0 {
		return lintPass("findings.retry_too_soon")
	}
	return lintFail("findings.retry_too_soon", fmt.Sprintf("%d %s sent again before the Retry-After of an earlier answer to them had passed: wait at least the Retry-After seconds (429, 503) before sending a request again.", count, plural(count, "request was", "requests were")), first...)
}

// writeMethods are the methods that write.
var writeMethods = []string{http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

// lintBlindRetries is blind_retry's rule on a HAR: a write answered 502, then one of the same
// key, method, target and body, arriving at or after its end, under another Idempotency-Key or
// none.
func lintBlindRetries(judged []linted) lintCheck {
	for _, A := range judged {
		if A.status == http.StatusBadGateway && slices.Contains(writeMethods, A.method) && A.body == nil {
			return lintSkip("findings.blind_retry", "needs request bodies: a write answered 502 has no postData.text")
		}
	}
	for i, A := range judged {
		if A.status != http.StatusBadGateway || !slices.Contains(writeMethods, A.method) {
			continue
		}
		for _, B := range judged[i+1:] {
			if B.key == A.key && B.method == A.method && B.target == A.target && B.body != nil && *B.body == *A.body && !B.arrived.Before(A.ended) &&
				(A.idem == nil || B.idem == nil || *A.idem != *B.idem) {
				return lintFail("findings.blind_retry", fmt.Sprintf("%s %s was answered 502 (entry %d), and the same write was sent again under another Idempotency-Key (entry %d): retry a 502 with the same Idempotency-Key, which answers the first write's result.", A.method, A.path, A.n, B.n), A.n, B.n)
			}
		}
	}
	return lintPass("findings.blind_retry")
}

// pageOf reads an answer's text as a page: its next_cursor and has_more (a JSON object with
// has_more, or pagination.has_more); false when it is none.
func pageOf(l *linted) (next string, more, ok bool) {
	if l.status != http.StatusOK || l.answer == nil {
		return "", false, false
	}
	var p struct {
		HasMore    *bool   `json:"has_more"`
		NextCursor *string `json:"next_cursor"`
		Pagination *struct {
			HasMore    *bool   `json:"has_more"`
			NextCursor *string `json:"next_cursor"`
		} `json:"pagination"`
	}
	if json.Unmarshal([]byte(*l.answer), &p) != nil {
		return "", false, false
	}
	if p.Pagination != nil && p.Pagination.HasMore != nil {
		p.HasMore, p.NextCursor = p.Pagination.HasMore, p.Pagination.NextCursor
	}
	if p.HasMore == nil {
		return "", false, false
	}
	if p.NextCursor != nil {
		next = *p.NextCursor
	}
	return next, *p.HasMore, true
}

// filtersOf are a query's parameters but cursor and limit, as a multiset in one string.
func filtersOf(q url.Values) string {
	var pairs []string
	for name, values := range q {
		if name == "cursor" || name == "limit" {
			continue
		}
		for _, v := range values {
			pairs = append(pairs, name+"="+v)
		}
	}
	slices.Sort(pairs)
	return strings.Join(pairs, "&")
}

// lintCursorFilters: a request with cursor keeps the other query parameters (limit aside) of
// the latest page whose next_cursor it sent.
func lintCursorFilters(judged []linted) lintCheck {
	pages, from := 0, map[string]int{} // a next_cursor: the latest page that gave it
	for i := range judged {
		l := &judged[i]
		if c := l.query.Get("cursor"); c != "" {
			if p, ok := from[c]; ok && filtersOf(judged[p].query) != filtersOf(l.query) {
				return lintFail("lint.cursor_filters", fmt.Sprintf("Entry %d sent the cursor of entry %d's page with other filters (%q, not %q): keep the same filters between pages.", l.n, judged[p].n, filtersOf(l.query), filtersOf(judged[p].query)), judged[p].n, l.n)
			}
		}
		if next, _, ok := pageOf(l); ok {
			pages++
			if next != "" {
				from[next] = i
			}
		}
	}
	if pages == 0 {
		return lintSkip("lint.cursor_filters", "needs response bodies: no 200 page has a text")
	}
	return lintPass("lint.cursor_filters")
}

// lintWalks: each 200 page with has_more true had its next_cursor sent later by its key.
func lintWalks(judged []linted) lintCheck {
	pages := 0
	sent := map[string][]int{} // a cursor sent: by whom (their places)
	for i := range judged {
		if c := judged[i].query.Get("cursor"); c != "" {
			sent[c] = append(sent[c], i)
		}
	}
	var unwalked []int
	for i := range judged {
		next, more, ok := pageOf(&judged[i])
		if !ok {
			continue
		}
		pages++
		if more && !slices.ContainsFunc(sent[next], func(k int) bool { return k > i && judged[k].key == judged[i].key }) {
			unwalked = append(unwalked, judged[i].n)
		}
	}
	switch {
	case pages == 0:
		return lintSkip("lint.walk_complete", "needs response bodies: no 200 page has a text")
	case len(unwalked) > 0:
		return lintFail("lint.walk_complete", fmt.Sprintf("%d %s more (has_more true) whose next_cursor was never sent: read every page to its end.", len(unwalked), plural(len(unwalked), "page had", "pages had")), unwalked...)
	}
	return lintPass("lint.walk_complete")
}

// lintReadOnly: no write answered 2xx or 502, when asked.
func lintReadOnly(judged []linted, asked bool) lintCheck {
	if !asked {
		return lintSkip("lint.read_only", "not asked (-read-only)")
	}
	var writes []int
	for _, l := range judged {
		if slices.Contains(writeMethods, l.method) && (l.status/100 == 2 || l.status == http.StatusBadGateway) {
			writes = append(writes, l.n)
		}
	}
	if len(writes) > 0 {
		return lintFail("lint.read_only", fmt.Sprintf("%d %s done (2xx, or a 502 that may have been): the client was to only read.", len(writes), plural(len(writes), "write was", "writes were")), writes...)
	}
	return lintPass("lint.read_only")
}

// lintPace: no key sent over 10 requests within one second (the exam key's limit).
func lintPace(judged []linted) lintCheck {
	byKey := map[string][]*linted{}
	var keys []string
	for i := range judged {
		l := &judged[i]
		if byKey[l.key] == nil {
			keys = append(keys, l.key)
		}
		byKey[l.key] = append(byKey[l.key], l)
	}
	var cited []int
	for _, k := range keys {
		ls := byKey[k]
		slices.SortStableFunc(ls, func(a, b *linted) int { return a.arrived.Compare(b.arrived) })
		for i := 0; i+10 < len(ls); i++ {
			if ls[i+10].arrived.Sub(ls[i].arrived) < time.Second {
				cited = append(cited, ls[i].n, ls[i+10].n)
				break
			}
		}
	}
	if len(cited) > 0 {
		return lintFail("lint.polling_rate", fmt.Sprintf("%d %s sent over 10 requests within one second: poll no faster than the limit (the exam key's: 10 a second), and wait a 429's Retry-After.", len(cited)/2, plural(len(cited)/2, "key", "keys")), cited...)
	}
	return lintPass("lint.polling_rate")
}

// lintAuthLoops: no request of a key after a 401 to it, nor of its method and path after a 403.
func lintAuthLoops(judged []linted) lintCheck {
	var cited []int
	for i, A := range judged {
		if A.status != http.StatusUnauthorized && A.status != http.StatusForbidden {
			continue
		}
		for _, B := range judged[i+1:] {
			if B.key == A.key && (A.status == http.StatusUnauthorized || B.method == A.method && B.path == A.path) {
				cited = append(cited, A.n, B.n)
				break
			}
		}
	}
	if len(cited) > 0 {
		return lintFail("lint.auth_loop", fmt.Sprintf("%d %s sent again after a 401 to its key (or a 403 to its method and path): a key refused stays refused; fix the key or its scopes, do not retry.", len(cited)/2, plural(len(cited)/2, "request was", "requests were")), cited...)
	}
	return lintPass("lint.auth_loop")
}

// written is the lint report in format, and its exit status: 0 no failure, 1 a failure.
func (r *lintReport) written(format string, e *examClient) ([]byte, int) {
	failing := 0
	for _, c := range r.Checks {
		if c.Result == "fail" {
			failing++
		}
	}
	status := map[bool]int{true: examFailed, false: examPassed}[failing > 0]
	switch format {
	case "json":
		b, _ := json.Marshal(r)
		out, _ := cleanJSON(b, func(s string) string { return e.inert(s, "") })
		return out, status
	case "junit":
		suite := junitReport{name: "exam lint " + e.inert(r.File, "")}
		for _, c := range r.Checks {
			jc := junitTest{class: "exam.lint", name: c.ID, result: c.Result}
			if c.Detail != nil {
				jc.message = *c.Detail
			}
			if c.Result == "fail" {
				jc.body = "HAR entries " + strings.Trim(fmt.Sprint(c.Requests), "[]")
			}
			suite.cases = append(suite.cases, jc)
		}
		return suite.xml(), status
	}
	var b strings.Builder
	for _, c := range r.Checks {
		switch c.Result {
		case "pass":
			fmt.Fprintf(&b, "pass %s\n", c.ID)
		case "fail":
			fmt.Fprintf(&b, "FAIL %s: %s (entries %s)\n", c.ID, e.inertText(*c.Detail), strings.ReplaceAll(strings.Trim(fmt.Sprint(c.Requests), "[]"), " ", ", "))
		default:
			fmt.Fprintf(&b, "skip %s: %s\n", c.ID, e.inertText(*c.Detail))
		}
	}
	fmt.Fprintf(&b, "lint: %d entries judged, %d other hosts, %d unreadable, %d failing\n", r.Judged, r.OtherHosts, r.Unreadable, failing)
	return []byte(b.String()), status
}

// ===== check: exam regrade, an attempt's trace judged again with no server =====

// exam regrade judges an attempt's trace (GET /v1/test_helpers/exams/{id}/trace) again: the
// world built from its _exam as a start builds it, the writes it did done again at their
// instants with their bodies and the ids they made, what each read showed found again in
// that world, and the grade computed as the server computes it. It sends nothing, and
// reports whether the grade it finds is the one the trace records.

// traceFile is a trace as exam regrade reads it.
type traceFile struct {
	Log *struct {
		Version *string         `json:"version"`
		Exam    *traceExamIn    `json:"_exam"`
		Entries *[]traceEntryIn `json:"entries"`
	} `json:"log"`
}

// traceExamIn is a trace's _exam as read.
type traceExamIn struct {
	ID        string          `json:"id"`
	Exam      string          `json:"exam"`
	Revision  int             `json:"revision"`
	Variant   int64           `json:"variant"`
	Scale     int             `json:"scale"`
	Account   string          `json:"account"`
	StartedAt string          `json:"started_at"`
	GradedAt  *string         `json:"graded_at"`
	Answer    json.RawMessage `json:"answer"`
	Lost      uint64          `json:"lost"`
	Passed    *bool           `json:"passed"`
	Score     *string         `json:"score"`
	Checks    []examCheckOut  `json:"checks"`
}

// traceEntryIn is an entry of a trace as read: what a journal entry is made again from.
type traceEntryIn struct {
	StartedDateTime string  `json:"startedDateTime"`
	Time            float64 `json:"time"`
	Request         struct {
		Method   string    `json:"method"`
		URL      string    `json:"url"`
		Headers  []harPair `json:"headers"`
		PostData *struct {
			MimeType string `json:"mimeType"`
			Text     string `json:"text"`
			Encoding string `json:"_encoding"`
		} `json:"postData"`
		BodySize int64 `json:"bodySize"`
	} `json:"request"`
	Response struct {
		Status  int       `json:"status"`
		Headers []harPair `json:"headers"`
		Content struct {
			Size     int64  `json:"size"`
			MimeType string `json:"mimeType"`
		} `json:"content"`
	} `json:"response"`
	Seq       *uint64         `json:"_seq"`
	Clock     *string         `json:"_clock"`
	Route     *string         `json:"_route"`
	Key       *string         `json:"_key"`
	Code      json.RawMessage `json:"_code"`
	Simulated json.RawMessage `json:"_simulated"`
	Run       json.RawMessage `json:"_run"`
	IDs       *[]string       `json:"_ids"`
	Writes    *uint32         `json:"_writes"`
	Written   json.RawMessage `json:"_written"`
	Body      string          `json:"_body"`
	Repeats   int32           `json:"_repeats"`
}

// regradeFile is exam regrade FILE (- standard input): the grade found, in the format asked
// for, and the exit status: 0 when it is the one recorded, 1 when a check differs (each said
// on standard error), 2 when the file is no graded trace.
func (e *examClient) regradeFile(c examCommand, stdin io.Reader) ([]byte, int, error) {
	data, err := readExamFile(c.arg, stdin)
	if err != nil {
		return nil, examCannotGrade, err
	}
	recorded, found, err := regrade(data, c.revision)
	if err != nil {
		return nil, examCannotGrade, fmt.Errorf("%s: %v", printable(cutField(c.arg, 256)), err)
	}
	raw, err := marshalJSON(found)
	if err != nil {
		return nil, examCannotGrade, err
	}
	g, err := readGrade(raw)
	if err != nil {
		return nil, examCannotGrade, err
	}
	status := examPassed
	for _, d := range gradeDiffers(recorded, found, c.revision >= 0) {
		e.errs.say("differs: " + d)
		status = examFailed
	}
	return e.gradeWritten(g, c.format), status, nil
}

// readExamFile is the file exam lint or regrade reads (- standard input), at most maxLintFile.
func readExamFile(name string, stdin io.Reader) ([]byte, error) {
	var data []byte
	var err error
	if name == "-" {
		if stdin == nil {
			stdin = strings.NewReader("")
		}
		data, err = io.ReadAll(io.LimitReader(stdin, maxLintFile+1))
	} else {
		data, err = readBounded(name, maxLintFile+1)
	}
	switch {
	case err != nil:
		return nil, fmt.Errorf("%s: %v", printable(cutField(name, 256)), err)
	case len(data) > maxLintFile:
		return nil, fmt.Errorf("%s: over %d MiB, the most exam reads", printable(cutField(name, 256)), maxLintFile>>20)
	}
	return data, nil
}

// regrade judges the trace data again, as revision (-1: the trace's own) of its exam: the
// grade the trace records, and the one found (as its GET writes it at its grading instant);
// an error saying why when data is no graded trace.
func regrade(data []byte, revision int) (*traceExamIn, gradeJSON, error) {
	f, err := readTrace(data)
	if err != nil {
		return nil, gradeJSON{}, err
	}
	ex := f.Log.Exam
	a, err := attemptOfTrace(ex, revision)
	if err != nil {
		return nil, gradeJSON{}, err
	}
	gradedAt, err := time.Parse(time.RFC3339Nano, *ex.GradedAt)
	if err != nil {
		return nil, gradeJSON{}, errors.New("graded_at is not an RFC 3339 timestamp")
	}
	es, replays, err := entriesOfTrace(*f.Log.Entries)
	if err != nil {
		return nil, gradeJSON{}, err
	}
	if n := len(es); ex.Lost > 0 && n > 0 && es[0].seq == 1 && es[n-1].seq == uint64(n) {
		a.kept = n // its journal kept its first n entries, which journal.complete's detail names
	}
	versions := a.world.versions(es, func(i, j int) int { return cmp.Compare(es[i].seq, es[j].seq) })
	d := versions[len(versions)-1]
	shownAgain(es, replays, versions)
	var answer *examAnswer
	if len(ex.Answer) > 0 && string(ex.Answer) != "null" {
		if answer, err = readExamAnswer(ex.Answer, a.def); err != nil {
			return nil, gradeJSON{}, errors.New("its answer is not one the exam takes: " + err.Error())
		}
	}
	grade := a.judge(d, es, ex.Lost, gradedAt, answer)
	return ex, a.gradeView(&tenant{id: tenantID{ex.Account, "test"}}, grade, gradedAt), nil
}

// readTrace is the graded trace data holds, or why it holds none.
func readTrace(data []byte) (*traceFile, error) {
	var f traceFile
	var typeFault *json.UnmarshalTypeError
	err := json.Unmarshal(data, &f)
	switch {
	case errors.As(err, &typeFault) && (typeFault.Field == "log" || typeFault.Field == "log.version" || typeFault.Field == "log.entries"):
		return nil, errors.New(`not HAR 1.2 (log.version "1.2" and a log.entries list)`)
	case errors.As(err, &typeFault):
		return nil, fmt.Errorf("not a trace: %s holds the wrong type of value (%s)", cmp.Or(typeFault.Field, "the document"), typeFault.Value)
	case err != nil:
		return nil, errors.New("not JSON")
	case f.Log == nil || f.Log.Version == nil || *f.Log.Version != "1.2" || f.Log.Entries == nil:
		return nil, errors.New(`not HAR 1.2 (log.version "1.2" and a log.entries list)`)
	case f.Log.Exam == nil:
		return nil, errors.New("no log._exam: not an attempt's trace (GET /v1/test_helpers/exams/{id}/trace)")
	case f.Log.Exam.GradedAt == nil:
		return nil, errors.New("graded_at is null: the attempt was not graded when its trace was read, so there is no grade to compare; read its trace again once it is graded")
	}
	return &f, nil
}

// attemptOfTrace is the attempt a trace's _exam names, as revision (-1: its own) of its exam,
// its world made again; an error when this binary holds neither.
func attemptOfTrace(ex *traceExamIn, revision int) (*examAttempt, error) {
	def := examNamed(ex.Exam)
	switch {
	case def == nil:
		return nil, fmt.Errorf("exam %q is not one this binary holds (%s)", cutField(ex.Exam, 64), examNames())
	case revision >= 0 && revision != def.revision:
		return nil, fmt.Errorf("-revision %d: this binary holds revision %d of %s", revision, def.revision, def.name)
	case revision < 0 && ex.Revision != def.revision:
		return nil, fmt.Errorf("revision %d of %s is not one this binary holds (it holds %d): judge it by that one with -revision %d", ex.Revision, def.name, def.revision, def.revision)
	case ex.Scale < 1 || ex.Scale > maxExamScale || ex.Variant < 0 || ex.Variant > maxVariant:
		return nil, errors.New("its scale or variant is not one an attempt takes")
	case !strings.HasPrefix(ex.Account, "acct_"):
		return nil, errors.New("its account is not a sandbox's (acct_...)")
	}
	start, err := time.Parse(time.RFC3339Nano, ex.StartedAt)
	if err != nil {
		return nil, errors.New("started_at is not an RFC 3339 timestamp")
	}
	return def.attemptOf(ex.ID, ex.Variant, ex.Scale, start.UTC(), tenantID{ex.Account, "test"})
}

// entriesOfTrace are a trace's entries made journal entries again, each with its _ members,
// in _seq order, its key one per mask, and for each the shipment a replayed 201 showed (its
// _ids; "" for any other entry); an error for an entry without them, a body lost, or seqs
// not increasing.
func entriesOfTrace(ins []traceEntryIn) ([]journalEntry, []string, error) {
	keys := map[string]*apiKey{}
	es := make([]journalEntry, 0, len(ins))
	replays := make([]string, 0, len(ins))
	for n := range ins {
		in := &ins[n]
		previous := uint64(0)
		if len(es) > 0 {
			previous = es[len(es)-1].seq
		}
		if err := in.judgeable(n+1, previous); err != nil {
			return nil, nil, err
		}
		e, err := in.entry(keys)
		if err != nil {
			return nil, nil, fmt.Errorf("entry %d (_seq %d): %v", n+1, *in.Seq, err)
		}
		replay := ""
		if e.status == http.StatusCreated && e.write != nil && e.traced.made == "" && len(*in.IDs) == 1 {
			replay = (*in.IDs)[0]
		}
		es, replays = append(es, e), append(replays, replay)
	}
	return es, replays, nil
}

// judgeable is why in, the n-th entry of a trace (from 1), cannot be judged again, or nil:
// it lacks the _ members, its write's body was not kept, or its _seq does not follow the
// previous entry's.
func (in *traceEntryIn) judgeable(n int, previous uint64) error {
	switch {
	case in.Seq == nil || in.Clock == nil || in.Route == nil || in.Key == nil || in.Code == nil || in.Simulated == nil || in.Run == nil || in.IDs == nil || in.Writes == nil || in.Written == nil:
		return fmt.Errorf("entry %d lacks the _ members of a trace (_seq, _clock, _route, _key, _code, _simulated, _run, _ids, _writes, _written)", n)
	case in.Body == "lost":
		return fmt.Errorf("entry %d (_seq %d): its write's body was not kept (past the 16 MiB an attempt keeps), and a write unseen is not judged", n, *in.Seq)
	case *in.Seq <= previous:
		return fmt.Errorf("entry %d: _seq %d does not follow %d (the _seqs increase)", n, *in.Seq, previous)
	}
	return nil
}

// entry is the journal entry in was written from; keys holds a key for each mask.
func (in *traceEntryIn) entry(keys map[string]*apiKey) (journalEntry, error) {
	arrived, err := time.Parse(time.RFC3339Nano, in.StartedDateTime)
	if err != nil {
		return journalEntry{}, errors.New("startedDateTime is not an RFC 3339 timestamp")
	}
	clock, err := time.Parse(time.RFC3339Nano, *in.Clock)
	if err != nil {
		return journalEntry{}, errors.New("_clock is not an RFC 3339 timestamp")
	}
	var problem, simulated, run, written string
	for _, m := range []struct {
		raw json.RawMessage
		to  *string
	}{{in.Code, &problem}, {in.Simulated, &simulated}, {in.Run, &run}, {in.Written, &written}} {
		if string(m.raw) != "null" && json.Unmarshal(m.raw, m.to) != nil {
			return journalEntry{}, errors.New("_code, _simulated, _run and _written are each a string or null")
		}
	}
	key := keys[*in.Key]
	if key == nil {
		key = &apiKey{mask: *in.Key}
		keys[*in.Key] = key
	}
	target := in.Request.URL
	if i := strings.Index(target, "://"); i >= 0 {
		rest := target[i+3:]
		target = rest[max(0, strings.IndexByte(rest, '/')):]
		if !strings.Contains(rest, "/") {
			target = "/"
		}
	}
	e := journalEntry{seq: *in.Seq, arrived: arrived.UnixNano(), duration: int64(math.Round(in.Time * 1e6)), clock: instantOf(clock), writes: *in.Writes, key: key,
		method: in.Request.Method, routePath: *in.Route, target: target, runTag: run, code: code(problem), size: in.Response.Content.Size, retryAfter: -1,
		status: int16(in.Response.Status), simulated: simulationNamed(simulated), bodySize: in.Request.BodySize, repeats: in.Repeats}
	in.headersOf(&e)
	if written != "" || in.Request.PostData != nil {
		e.traced = &tracedParts{made: written}
	}
	if p := in.Request.PostData; p != nil {
		body := []byte(p.Text)
		if p.Encoding == "base64" {
			if body, err = base64.StdEncoding.DecodeString(p.Text); err != nil {
				return journalEntry{}, errors.New("its postData is not base64 as its _encoding says")
			}
		}
		e.traced.body, e.traced.contentType = body, p.MimeType
		if e.method == http.MethodPost && slices.Contains(writeRoutes, "POST "+e.routePath) { // a write: its Idempotency-Key was read before its body
			key, _ := parseIdempotencyKey([]string{e.idempotencyKey})
			e.write = &writeMark{key: key, body: sha256.Sum256(body)}
			if e.bookingRan() {
				e.write.orderID = bookedOrder(body)
			}
		}
	}
	return e, nil
}

// headersOf sets what e keeps of its request's and answer's headers.
func (in *traceEntryIn) headersOf(e *journalEntry) {
	e.requestID, _ = headerOf(in.Response.Headers, "Request-Id")
	e.contentType, _ = headerOf(in.Response.Headers, "Content-Type")
	if v, ok := headerOf(in.Response.Headers, "Retry-After"); ok {
		if n, err := strconv.ParseInt(v, 10, 32); err == nil {
			e.retryAfter = int32(n)
		}
	}
	e.prefer, e.hasPrefer = headerOf(in.Request.Headers, "Prefer")
	e.idempotencyKey, e.hasIdempotencyKey = headerOf(in.Request.Headers, "Idempotency-Key")
}

// bookingRan reports whether e, a write whose body was read, is a booking whose handler ran
// (it alone notes the order booked): not a replay, not refused for its Idempotency-Key or
// its query, not answered by Prefer before the write.
func (e *journalEntry) bookingRan() bool {
	_, query, _ := strings.Cut(e.target, "?")
	return e.method == http.MethodPost && e.routePath == "/v1/test_helpers/shipments" && query == "" &&
		e.code != codeIdempotencyKeyInUse && e.code != codeIdempotencyKeyReused &&
		!(e.status == http.StatusCreated && e.traced.made == "") && !(e.simulated == byPrefer && e.status != http.StatusBadGateway)
}

// headerOf is the value of the first header of this name (any case), and whether there is one.
func headerOf(h []harPair, name string) (string, bool) {
	for _, p := range h {
		if strings.EqualFold(p.Name, name) {
			return p.Value, true
		}
	}
	return "", false
}

// simulationNamed is the simulation the journal names so ("" for none).
func simulationNamed(name string) simulation {
	for _, s := range []simulation{byPrefer, byFaults, byScript} {
		if s.String() == name {
			return s
		}
	}
	return notSimulated
}

// shownAgain finds again what each entry's answer showed, from the version of the data it
// read (versions[_writes]; the last past them): a read's and a tracking number's 404, found
// as the operation finds them, with a cursor taken as written; a shipment a write made (or
// its replay answered: replays, by entry).
func shownAgain(es []journalEntry, replays []string, versions []*tenantData) {
	last := versions[len(versions)-1]
	trusting := &cursorSigner{}
	for i := range es {
		e := &es[i]
		d := last
		if int(e.writes) < len(versions) {
			d = versions[e.writes]
		}
		switch {
		case e.routePath == "/v1/test_helpers/shipments" || e.routePath == "/v1/test_helpers/shipments/{id}/events":
			made := ""
			if e.traced != nil {
				made = e.traced.made
			}
			made = cmp.Or(made, replays[i])
			if s := last.shipments.find(made); made != "" && s != nil {
				e.shown = showing{kind: showsWritten, ship: s}
			}
		case e.simulated != notSimulated || e.status != http.StatusOK && e.status != http.StatusNotFound || e.method != http.MethodGet && e.method != http.MethodHead:
		default:
			_, e.shown, _ = d.answerOf(nil, e.routePath, e.target, e.clock.time(), trusting)
		}
	}
}

// gradeDiffers says where the grade found differs from the one recorded: passed, score, and
// each check's result, detail, requests and margin_ms (byID: matched by id, as under
// -revision, one in only one grade differing; else by place).
func gradeDiffers(recorded *traceExamIn, found gradeJSON, byID bool) []string {
	var out []string
	show := func(v any) string {
		b, _ := json.Marshal(v)
		return string(b)
	}
	if (recorded.Passed == nil) != (found.Passed == nil) || recorded.Passed != nil && *recorded.Passed != *found.Passed {
		out = append(out, fmt.Sprintf("passed: recorded %s, regraded %s", show(recorded.Passed), show(found.Passed)))
	}
	if show(recorded.Score) != show(found.Score) {
		out = append(out, fmt.Sprintf("score: recorded %s, regraded %s", show(recorded.Score), show(found.Score)))
	}
	pairs := [][2]*examCheckOut{}
	for i := range max(len(recorded.Checks), len(found.Checks)) {
		var r, f *examCheckOut
		if i < len(recorded.Checks) {
			r = &recorded.Checks[i]
		}
		if i < len(found.Checks) {
			c := found.Checks[i]
			f = &examCheckOut{ID: c.ID, Result: c.Result, Detail: c.Detail, Requests: c.Requests, MarginMS: c.MarginMS}
		}
		pairs = append(pairs, [2]*examCheckOut{r, f})
	}
	if byID {
		pairs = checksByID(recorded.Checks, found.Checks)
	}
	for _, p := range pairs {
		r, f := p[0], p[1]
		switch {
		case r == nil:
			out = append(out, fmt.Sprintf("%s: recorded none, regraded %s: %s", f.ID, f.Result, checkSaid(f)))
		case f == nil:
			out = append(out, fmt.Sprintf("%s: recorded %s, regraded none: the revision judged has no such check", r.ID, r.Result))
		case r.ID != f.ID:
			out = append(out, fmt.Sprintf("%s: recorded in the place of %s: the checks are not the exam's (judge by id with -revision)", r.ID, f.ID))
		case r.Result != f.Result || show(r.Detail) != show(f.Detail) || show(r.Requests) != show(f.Requests) || show(r.MarginMS) != show(f.MarginMS):
			out = append(out, fmt.Sprintf("%s: recorded %s, regraded %s: %s", r.ID, r.Result, f.Result, checkSaid(f)))
		}
	}
	return out
}

// checksByID pairs the checks of two grades by id: those recorded, in their order, then those
// found alone.
func checksByID(recorded []examCheckOut, found []checkJSON) [][2]*examCheckOut {
	var pairs [][2]*examCheckOut
	taken := map[string]bool{}
	for i := range recorded {
		p := [2]*examCheckOut{&recorded[i], nil}
		for _, c := range found {
			if c.ID == recorded[i].ID {
				p[1], taken[c.ID] = &examCheckOut{ID: c.ID, Result: c.Result, Detail: c.Detail, Requests: c.Requests, MarginMS: c.MarginMS}, true
			}
		}
		pairs = append(pairs, p)
	}
	for _, c := range found {
		if !taken[c.ID] {
			pairs = append(pairs, [2]*examCheckOut{nil, {ID: c.ID, Result: c.Result, Detail: c.Detail, Requests: c.Requests, MarginMS: c.MarginMS}})
		}
	}
	return pairs
}

// checkSaid is what a check found, for a line that names it: its detail, the entries it
// cites and its margin.
func checkSaid(c *examCheckOut) string {
	said := "passed"
	if c.Detail != nil {
		said = *c.Detail
	}
	if len(c.Requests) > 0 {
		said += " (" + entriesCited(c.Requests) + ")"
	}
	if c.MarginMS != nil {
		said += fmt.Sprintf(" (margin %d ms)", *c.MarginMS)
	}
	return said
}
