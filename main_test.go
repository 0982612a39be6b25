package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/base64"
	"encoding/json"
	"encoding/xml"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"html"
	"io"
	"log/slog"
	"maps"
	"math"
	"math/big"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path"
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
	"testing"
	"time"
	"unicode"
	"unicode/utf8"
	"unsafe"
)

// The suite, in the order of this file, its sections under the code's own banners (grep
// '^// =====' *.go lists both); each section ends with its feature's fuzz targets (one for
// every parser of client or dataset input) and benchmarks (through the whole handler
// chain). Tests run in parallel but for the few that measure the heap or set the
// collector; real processes are started only where signals, pipes and sockets are the
// point.
//
//   - The harness
//     Every request goes through the real handler chain (server.handler, as run serves it),
//     and every response is checked against the rules that hold for all responses and
//     against the OpenAPI document. Helpers take the caller's own t. The benchmarks' writer
//     and floor, and the files' own shape (their listed sections, this list included).
//   - main.go, serve: the process (flags and environment, hosts and origins, loading, serving and the way out, the collector)
//     The way out in the worst arrangement first (its 15 s of waiting is what the other
//     tests overlap), flags and run, datasets, shutdown, memory.
//   - main.go, serve: the server and its route table, every request, the checks in their order, the body, writing an answer, the access log
//     Routes and paths, real sockets and connection limits, the body cap, the check order,
//     panics, the log.
//   - main.go, serve: Prefer, and faults (with auth.go's Rehearsals counted)
//     Simulated answers, delays, failures that recover, -faults, a request at its own instant.
//   - main.go, serve and landing: what needs no key, and the landing page
//     The OpenAPI document, the README's and docs' examples run as written, the container,
//     the page, CORS.
//   - auth.go: Keys and scopes, and the rate limit
//   - auth.go: Tenants, their clocks and timelines, and the clock operations
//     acct_sync at each instant, refusals, shipments created later, pages under a moving
//     timeline.
//   - auth.go: The journal, its reads, the findings, the journal as HAR
//     The findings one table of them.
//   - auth.go: Sandboxes and stored answers; main.go, serve: writes
//     Sandboxes made, refused, forgotten; idempotency; the registry's bounds and the one
//     bounded list; each fault of the registry, made deterministic (a deadlock, a leak, a
//     late write, a key forgotten in progress).
//   - auth.go: Exams, an attempt and its grade; main.go, serve: the exam routes
//     The catalogue, the worlds drawn for each variant, each exam's reference client and its
//     traps at two scales, margins, the grade's reads and answers, held against abuse; go run
//     . exam and exam run against the sandbox and against stand-ins hostile and scripted.
//   - tracking.go: A booking, a shipment created in a sandbox; main.go, serve: its write
//     Each rule both ways, the 502 and blind_retry, entries judged by the version they read,
//     writes racing reads.
//   - tracking.go: Shipment events, added to a sandbox's shipment
//     Moves, refused, replayed, at their bound, racing reads and their sandbox's delete.
//   - tracking.go: Normalizing raw carrier events, tracking views, the index, the two operations
//   - orders.go: Loading, the index, the query, pages and the two operations
//   - cursor.go: Cursors
//   - errors.go: Errors, simulated answers and the floor
//   - main.go, landing: the reference, for people and for agents
//     Every anchor and link, the samples run and compiled, the page in a real browser at two
//     widths.
//   - main.go, mcp: the MCP door
//     Both transports and every revision with raw JSON-RPC, each tool's success and error
//     result, each refusal, tool calls journaled and judged, the schemas held to this file's
//     validator, the resources, go run . mcp in a real process, what a tool call costs.
//   - main.go, check: the conformance kit against servers right, broken and hostile
//     Every rule caught failing by a broken server, the hostile servers that attack it, its
//     reports, check diff, and the bounds of every function.

// ===== The harness =====

// TestMain lets more tests run at once than the machine has cores, go test's default: most
// of them wait on sockets, timers and other processes. -parallel, when given, wins, and a
// fuzzer keeps its default number of workers.
func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" || f.Name == "test.fuzz" })
	if !given {
		flag.Set("test.parallel", "8")
	}
	os.Exit(m.Run())
}

// testNow is the fake clock's start: after sk_test_sandbox_expired's expiry.
var testNow = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

// problem is an error answer's body as the contract writes it (RFC 9457 problem details with
// the code and the request id, param when a parameter is at fault): what the server's
// hand-written bodies are decoded into and held to.
type problem struct {
	Type      string  `json:"type"`
	Title     string  `json:"title"`
	Status    int     `json:"status"`
	Detail    string  `json:"detail"`
	Code      code    `json:"code"`
	Param     *string `json:"param,omitempty"`
	RequestID string  `json:"request_id"`
}

// heldSequences is how many sequences the tenant holds.
func (t *tenant) heldSequences() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.sequences.len()
}

// heldJournal is the tenant's journal, nil when it has none; read it only while no request
// of the tenant runs.
func (t *tenant) heldJournal() *journal {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.journal
}

// fakeClock is the server's clock in tests. Each reading moves it on by step, so that a
// suite of requests does not exhaust the rate limit unless a test sets step to 0.
type fakeClock struct {
	mu   sync.Mutex
	t    time.Time
	step time.Duration
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.t
	c.t = c.t.Add(c.step)
	return t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// lockedBuffer is a bytes.Buffer safe for the concurrent writes of a server.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type envOptions struct {
	data         []byte // a dataset; nil: the embedded default
	seed         int    // -seed-orders
	rate         int    // -rate; 0 here means the default 25, -1 means off
	secret       string // -cursor-secret
	step         time.Duration
	extra        []route
	quiet        bool                // log to io.Discard rather than keep the log
	cors         string              // -cors-origin
	remote       bool                // listening where other machines reach it: the page hides the keys
	start        time.Time           // the start instant; zero: testNow
	faults       string              // -faults; "" for none
	journal      int                 // -journal; 0 here means the default 1,000, -1 means off
	journalBytes int64               // what all journals may hold; 0: the default 256 MiB
	examEntries  int                 // the first entries an exam attempt's journal keeps; 0: the contract's 20,000
	wall         bool                // the server reads the machine's clock (a rate limit refills as time passes), not the fake one
	mcpKey       string              // -mcp-key
	getenv       func(string) string // the process's environment, as the server reads it; nil: none
	writeTimeout time.Duration       // the listener's, as the MCP door reads it; 0: the default 30 s
	unchecked    bool                // its answers are not checked against the document and the common rules (a test of something else, run many times: TestExamTracesRegrade)
}

// env is one sandbox under test. Its methods take the caller's own t, so that a failure
// is reported, and stops, where it happens.
type env struct {
	h         http.Handler
	logs      *lockedBuffer
	clock     *fakeClock
	stopping  chan struct{} // close it to start the server's shutdown
	srv       *server
	sb        *sandbox
	unchecked bool // envOptions.unchecked
}

func newEnv(t testing.TB, o envOptions) *env {
	t.Helper()
	data, name := o.data, "test"
	if data == nil {
		data, name = defaultDataset, defaultDatasetName
	}
	logs := &lockedBuffer{}
	var out io.Writer = logs
	if o.quiet {
		out = io.Discard
	}
	access := newLogBuffer(out, 0) // each line straight out
	log := slog.New(slog.NewJSONHandler(access, nil))
	start := o.start
	if start.IsZero() {
		start = testNow
	}
	sb, err := loadBytes(name, data, o.seed, start, log)
	if err != nil {
		t.Fatal(err)
	}
	rate := o.rate
	switch rate {
	case 0:
		rate = 25
	case -1:
		rate = 0
	}
	step := o.step
	if step == 0 {
		step = time.Second
	}
	clock := &fakeClock{t: testNow, step: step}
	if o.step < 0 {
		clock.step = 0
	}
	stopping := make(chan struct{})
	var faults *faultPlan
	if o.faults != "" {
		if faults, err = parseFaults(o.faults); err != nil {
			t.Fatal(err)
		}
	}
	journal := o.journal
	switch journal {
	case 0:
		journal = defaultJournal
	case -1:
		journal = 0
	}
	now := clock.now
	if o.wall {
		now = time.Now
	}
	s, err := newServer(sb, serverOptions{rate: rate, cursorSecret: o.secret, log: log, access: access, now: now, stopping: stopping,
		corsOrigin: o.cors, loopback: !o.remote, faults: faults, journal: journal, journalBytes: o.journalBytes, mcpKey: o.mcpKey, getenv: o.getenv, writeTimeout: o.writeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	if o.examEntries > 0 {
		s.registry.examEntries = o.examEntries
	}
	return &env{h: s.handler(o.extra...), logs: logs, clock: clock, stopping: stopping, srv: s, sb: sb, unchecked: o.unchecked}
}

// loadBytes loads a dataset held in memory, as the sandbox loads a file.
func loadBytes(name string, data []byte, seed int, start time.Time, log *slog.Logger) (*sandbox, error) {
	return loadDataset(name, bytes.NewReader(data), seed, start, log)
}

// reply is a response as the tests look at it.
type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) String() string { return fmt.Sprintf("%d %s", r.status, r.body) }

// paramName is the problem's param, "" when there is none.
func (p problem) paramName() string {
	if p.Param == nil {
		return ""
	}
	return *p.Param
}

// asAPIError is err as the API's error, or nil.
func asAPIError(err error) *apiError {
	var e *apiError
	if errors.As(err, &e) {
		return e
	}
	return nil
}

func (r reply) problem(t testing.TB) problem {
	t.Helper()
	var p problem
	parameterFault := r.status == 422 && !bytes.Contains(r.body, []byte(`"code":"capability_unavailable"`)) ||
		r.status == 404 && bytes.Contains(r.body, []byte(`is shown in this account at`)) // a booking's order: param order_id
	for _, c := range []string{"invalid_cursor", "invalid_idempotency_key", "order_already_linked"} {
		parameterFault = parameterFault || bytes.Contains(r.body, []byte(`"code":"`+c+`"`))
	}
	if hasParam := bytes.Contains(r.body, []byte(`"param":`)); hasParam != parameterFault {
		t.Errorf("a %d problem with param present = %v: param is there exactly for parameter faults: %s", r.status, hasParam, r.body)
	}
	mustDecodeExact(t, r.body, &p)
	return p
}

// do sends r through the handler chain and checks the response.
func (e *env) do(t testing.TB, r *http.Request) reply {
	t.Helper()
	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, r)
	res := rec.Result()
	rep := reply{status: res.StatusCode, header: res.Header, body: rec.Body.Bytes()}
	if !e.unchecked {
		checkResponse(t, r, rep)
	}
	return rep
}

// get sends GET target with key as a Bearer credential ("" for none) and header pairs.
func (e *env) get(t testing.TB, target, key string, headerPairs ...string) reply {
	t.Helper()
	return e.do(t, newRequest(http.MethodGet, target, key, headerPairs...))
}

var requestIDPattern = regexp.MustCompile(`^req_[0-9a-z]{20}$`)

func newRequest(method, target, key string, headerPairs ...string) *http.Request {
	r := httptest.NewRequest(method, "http://127.0.0.1:8080"+target, nil)
	if key != "" {
		r.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i+1 < len(headerPairs); i += 2 {
		r.Header.Add(headerPairs[i], headerPairs[i+1])
	}
	return r
}

// newBodyRequest is a request with a body.
func newBodyRequest(method, target, key, body string, headerPairs ...string) *http.Request {
	r := newRequest(method, target, key, headerPairs...)
	r.Body = io.NopCloser(strings.NewReader(body))
	r.ContentLength = int64(len(body))
	return r
}

// checkResponse checks what holds for every response: the common headers, an exact
// Content-Length, problem+json for every error with the request id of the header, and
// conformance to the OpenAPI document.
func checkResponse(t testing.TB, r *http.Request, rep reply) {
	t.Helper()
	id := rep.header.Get("Request-Id")
	if !requestIDPattern.MatchString(id) {
		t.Errorf("%s %s: Request-Id = %q, want req_ and 20 characters", r.Method, r.URL, id)
	}
	if r.Method == http.MethodOptions && rep.status == http.StatusNoContent && len(rep.body) == 0 {
		return // a CORS preflight: transport for browsers, with the common headers only
	}
	for name, want := range map[string]string{"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff", "Content-Length": strconv.Itoa(len(rep.body))} {
		if name == "Content-Length" && rep.status == http.StatusNoContent {
			want = "" // a 204 has none (RFC 9110, 8.6)
		}
		if got := rep.header.Get(name); got != want {
			t.Errorf("%s %s: %s = %q, want %q", r.Method, r.URL, name, got, want)
		}
	}
	if rep.status >= 400 {
		if ct := rep.header.Get("Content-Type"); ct != "application/problem+json" {
			t.Errorf("%s %s: error Content-Type = %q, want application/problem+json", r.Method, r.URL, ct)
		}
		p := rep.problem(t)
		if p.Type != "about:blank" || p.Status != rep.status || p.Title != rfc9110Titles[rep.status] || p.RequestID != id || p.Detail == "" || p.Code == "" {
			t.Errorf("%s %s: problem %+v does not match status %d and Request-Id %s", r.Method, r.URL, p, rep.status, id)
		}
	} else if ct := rep.header.Get("Content-Type"); ct != "application/json" && !(!underTheAPI(r.URL.Path) && pageTypes[ct]) && !(rep.status == http.StatusNoContent && ct == "") &&
		!(r.URL.Query().Get("format") == "junit" && ct == "application/xml; charset=utf-8") {
		t.Errorf("%s %s: Content-Type = %q, want application/json", r.Method, r.URL, ct)
	}
	if err := theOpenAPI(t).checkResponse(r, rep); err != nil {
		t.Errorf("%s %s answered %d, which the OpenAPI document does not allow: %v\nbody: %s", r.Method, r.URL, rep.status, err, rep.body)
	}
}

// pageTypes are the types of the pages for people: /, the reference, its Markdown, llms.txt.
var pageTypes = map[string]bool{"text/html; charset=utf-8": true, "text/markdown; charset=utf-8": true, "text/plain; charset=utf-8": true}

// rfc9110Titles are the reason phrases of RFC 9110 (429: RFC 6585) that problem titles are.
var rfc9110Titles = map[int]string{
	400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
	409: "Conflict", 413: "Content Too Large", 422: "Unprocessable Content", 429: "Too Many Requests", 500: "Internal Server Error",
	502: "Bad Gateway", 503: "Service Unavailable",
}

// caseName is a subtest's name made of the case's own text (a method and a path, a query):
// its slashes and spaces are word breaks, so that the name can be typed into -run
// (TestRoutesMethodsAndPaths/GET_v1_orders), where a slash would make levels of it.
func caseName(s string) string {
	return strings.Join(strings.FieldsFunc(s, func(r rune) bool { return r == '/' || r == ' ' }), " ")
}

// wantProblem checks an error response's status, code and param.
func wantProblem(t testing.TB, rep reply, status int, code, param string) problem {
	t.Helper()
	if rep.status != status {
		t.Fatalf("status = %d, want %d; body %s", rep.status, status, rep.body)
	}
	p := rep.problem(t)
	if string(p.Code) != code || p.paramName() != param {
		t.Errorf("code, param = %q, %q; want %q, %q (body %s)", p.Code, p.paramName(), code, param, rep.body)
	}
	return p
}

// withoutRequestID is an error body with its request id blanked, for comparing bodies.
func withoutRequestID(t testing.TB, body []byte) string {
	t.Helper()
	return regexp.MustCompile(`"request_id":"req_[0-9a-z]{20}"`).ReplaceAllString(string(body), `"request_id":"-"`)
}

type openAPI struct {
	root  map[string]any
	paths []openAPIPath
}

type openAPIPath struct {
	template string // the full path, server path included, e.g. /v1/orders/{id}
	match    *regexp.Regexp
	item     map[string]any
}

var (
	openAPIOnce sync.Once
	theDocument *openAPI
	openAPIErr  error
)

func theOpenAPI(t testing.TB) *openAPI {
	t.Helper()
	openAPIOnce.Do(func() { theDocument, openAPIErr = parseOpenAPI(openAPIDocument) })
	if openAPIErr != nil {
		t.Fatalf("openapi.json: %v", openAPIErr)
	}
	return theDocument
}

func parseOpenAPI(data []byte) (*openAPI, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var root map[string]any
	if err := dec.Decode(&root); err != nil {
		return nil, err
	}
	d := &openAPI{root: root}
	base, err := serverPath(root["servers"])
	if err != nil {
		return nil, err
	}
	for template, v := range root["paths"].(map[string]any) {
		item := v.(map[string]any)
		prefix := base
		if item["servers"] != nil {
			if prefix, err = serverPath(item["servers"]); err != nil {
				return nil, err
			}
		}
		full := prefix + template
		re := "^" + regexp.MustCompile(`\\\{[^}]+\\\}`).ReplaceAllString(regexp.QuoteMeta(full), `[^/]+`) + "$"
		d.paths = append(d.paths, openAPIPath{template: full, match: regexp.MustCompile(re), item: item})
	}
	return d, nil
}

func serverPath(servers any) (string, error) {
	list, ok := servers.([]any)
	if !ok || len(list) == 0 {
		return "", errors.New("no servers")
	}
	u, err := url.Parse(list[0].(map[string]any)["url"].(string))
	if err != nil {
		return "", err
	}
	return u.Path, nil
}

// resolve follows a $ref within the document.
func (d *openAPI) resolve(node any) map[string]any {
	m, _ := node.(map[string]any)
	for m != nil && m["$ref"] != nil {
		var cur any = d.root
		for _, part := range strings.Split(strings.TrimPrefix(m["$ref"].(string), "#/"), "/") {
			cur = cur.(map[string]any)[part]
		}
		m = cur.(map[string]any)
	}
	return m
}

// operation finds the documented operation and response for a request and status. A
// method the path does not document must be the GET operation's 405.
func (d *openAPI) response(r *http.Request, status int) (map[string]any, error) {
	p := r.URL.EscapedPath()
	if p == "/healthz" {
		p = "/v1/healthz" // the same answer, for probes that know no base URL
	}
	for _, dp := range d.paths {
		if !dp.match.MatchString(p) {
			continue
		}
		method := strings.ToLower(r.Method)
		op, _ := dp.item[method].(map[string]any)
		if op == nil {
			if status != http.StatusMethodNotAllowed {
				return nil, fmt.Errorf("%s %s is not documented", r.Method, dp.template)
			}
			for _, m := range []string{"get", "post", "delete"} { // the 405 any operation of the path documents
				if other, ok := dp.item[m].(map[string]any); ok {
					op = other
					break
				}
			}
		}
		resp := d.resolve(op["responses"].(map[string]any)[strconv.Itoa(status)])
		if resp == nil {
			return nil, fmt.Errorf("status %d is not documented for %s %s", status, method, dp.template)
		}
		return resp, nil
	}
	if status != http.StatusNotFound {
		return nil, fmt.Errorf("an undocumented path answered %d, not 404", status)
	}
	if r.Method == http.MethodHead {
		return d.resolve(map[string]any{"$ref": "#/components/responses/HeadNotFound"}), nil
	}
	return d.resolve(map[string]any{"$ref": "#/components/responses/NotFound"}), nil
}

// checkResponse validates a response's body and headers against the document.
func (d *openAPI) checkResponse(r *http.Request, rep reply) error {
	if !underTheAPI(r.URL.Path) || r.URL.Path == "/mcp" {
		return nil // a page for people (/, the reference and its pages), and the MCP door: the document describes neither
	}
	resp, err := d.response(r, rep.status)
	if err != nil {
		return err
	}
	ct := rep.header.Get("Content-Type")
	media := asMap(asMap(resp["content"])[ct])
	if r.Method == http.MethodHead || resp["content"] == nil && ct == "" && len(rep.body) == 0 {
		if resp["content"] != nil {
			return fmt.Errorf("a HEAD answer %d is documented with a body", rep.status)
		}
	} else if media == nil {
		return fmt.Errorf("Content-Type %q is not documented", ct)
	}
	if schema := media["schema"]; media != nil && schema != nil && strings.HasSuffix(ct, "json") {
		dec := json.NewDecoder(bytes.NewReader(rep.body))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			return fmt.Errorf("body is not JSON: %v", err)
		}
		if err := d.validate(schema, v, "$", nil); err != nil {
			return err
		}
	}
	documented := map[string]map[string]any{}
	for name, h := range asMap(resp["headers"]) {
		documented[http.CanonicalHeaderKey(name)] = d.resolve(h)
		if documented[http.CanonicalHeaderKey(name)]["required"] == true && rep.header.Get(name) == "" {
			return fmt.Errorf("required header %s is missing", name)
		}
	}
	for name, values := range rep.header {
		switch name {
		case "Content-Type", "Content-Length", "Date", "Connection", "Vary":
			continue // transport, not the API's
		}
		if strings.HasPrefix(name, "Access-Control-") {
			continue // CORS, for browsers (-cors-origin), not the API's
		}
		h := documented[name]
		if h == nil {
			return fmt.Errorf("header %s is not documented for this response", name)
		}
		for _, v := range values {
			var value any = v
			if asMap(h["schema"])["type"] == "integer" { // a header's text, read as its schema's type
				value = json.Number(v)
				if _, err := strconv.ParseInt(v, 10, 64); err != nil {
					return fmt.Errorf("header %s: %q is not an integer", name, v)
				}
			}
			if err := d.validate(h["schema"], value, "header "+name, nil); err != nil {
				return err
			}
		}
	}
	return nil
}

func asMap(v any) map[string]any { m, _ := v.(map[string]any); return m }

// schemaKeywords are the keywords the validator applies (the document's, and the MCP
// door's tool schemas'); annotations are accepted and ignored; anything else is an error.
var annotations = map[string]bool{"description": true, "examples": true, "format": true, "default": true, "title": true, "required": true}

// validate checks v against schema. observe, when set, is told each (schema, property)
// pair a value has, for schemas reached through a $ref.
func (d *openAPI) validate(schema, v any, at string, observe func(ref, prop string)) error {
	s := asMap(schema)
	if s == nil {
		return fmt.Errorf("%s: schema is not an object", at)
	}
	ref := ""
	if r, ok := s["$ref"].(string); ok {
		ref = r
		s = d.resolve(s)
	}
	for kw := range s {
		switch kw {
		case "type", "enum", "required", "properties", "additionalProperties", "items", "pattern", "minimum", "maximum", "minLength", "maxLength", "oneOf", "anyOf", "minItems", "maxItems", "maxProperties":
		default:
			if !annotations[kw] && !strings.HasPrefix(kw, "x-") {
				return fmt.Errorf("%s: the validator does not know keyword %q", at, kw)
			}
		}
	}
	if t, ok := s["type"]; ok {
		var types []string
		switch t := t.(type) {
		case string:
			types = []string{t}
		case []any:
			for _, x := range t {
				types = append(types, x.(string))
			}
		}
		if !slices.Contains(types, jsonTypeOf(v)) && !(jsonTypeOf(v) == "integer" && slices.Contains(types, "number")) {
			return fmt.Errorf("%s: %s is not of type %v", at, jsonTypeOf(v), types)
		}
	}
	if list, ok := s["oneOf"].([]any); ok {
		var holding []any
		for _, sub := range list {
			if d.validate(sub, v, at, nil) == nil {
				holding = append(holding, sub)
			}
		}
		if len(holding) != 1 {
			return fmt.Errorf("%s: %d of the oneOf schemas hold, want exactly one", at, len(holding))
		}
		if observe != nil {
			d.validate(holding[0], v, at, observe) // what the one that holds shows
		}
	}
	if list, ok := s["anyOf"].([]any); ok && !slices.ContainsFunc(list, func(sub any) bool { return d.validate(sub, v, at, nil) == nil }) {
		var why []string
		for _, sub := range list {
			why = append(why, d.validate(sub, v, at, nil).Error())
		}
		return fmt.Errorf("%s: none of the anyOf schemas holds: %s", at, strings.Join(why, "; "))
	}
	if enum, ok := s["enum"].([]any); ok && !slices.ContainsFunc(enum, func(e any) bool { return fmt.Sprint(e) == fmt.Sprint(v) }) {
		return fmt.Errorf("%s: %v is not one of %v", at, v, enum)
	}
	if str, ok := v.(string); ok {
		if p, ok := s["pattern"].(string); ok && !regexp.MustCompile(p).MatchString(str) {
			return fmt.Errorf("%s: %q does not match %s", at, str, p)
		}
		if n, ok := s["minLength"].(json.Number); ok {
			if min, _ := n.Int64(); int64(len([]rune(str))) < min {
				return fmt.Errorf("%s: %q is shorter than %d", at, str, min)
			}
		}
		if n, ok := s["maxLength"].(json.Number); ok {
			if max, _ := n.Int64(); int64(len([]rune(str))) > max {
				return fmt.Errorf("%s: %q is longer than %d", at, str, max)
			}
		}
	}
	if num, ok := v.(json.Number); ok {
		f, _ := num.Float64()
		if m, ok := s["minimum"].(json.Number); ok {
			if min, _ := m.Float64(); f < min {
				return fmt.Errorf("%s: %v is below the minimum %v", at, num, m)
			}
		}
		if m, ok := s["maximum"].(json.Number); ok {
			if max, _ := m.Float64(); f > max {
				return fmt.Errorf("%s: %v is above the maximum %v", at, num, m)
			}
		}
	}
	if obj, ok := v.(map[string]any); ok {
		if n, ok := s["maxProperties"].(json.Number); ok {
			if max, _ := n.Int64(); int64(len(obj)) > max {
				return fmt.Errorf("%s: %d properties, more than %d", at, len(obj), max)
			}
		}
		props := asMap(s["properties"])
		for _, req := range asSlice(s["required"]) {
			if _, ok := obj[req.(string)]; !ok {
				return fmt.Errorf("%s: required property %q is missing", at, req)
			}
		}
		for k, pv := range obj {
			if ps, ok := props[k]; ok {
				if observe != nil && ref != "" {
					observe(ref, k)
				}
				if err := d.validate(ps, pv, at+"."+k, observe); err != nil {
					return err
				}
				continue
			}
			switch ap := s["additionalProperties"].(type) {
			case bool:
				if !ap {
					return fmt.Errorf("%s: property %q is not in the schema", at, k)
				}
			case map[string]any:
				if err := d.validate(ap, pv, at+"."+k, observe); err != nil {
					return err
				}
			}
		}
	}
	if arr, ok := v.([]any); ok {
		if n, ok := s["minItems"].(json.Number); ok {
			if min, _ := n.Int64(); int64(len(arr)) < min {
				return fmt.Errorf("%s: %d items, fewer than %d", at, len(arr), min)
			}
		}
		if n, ok := s["maxItems"].(json.Number); ok {
			if max, _ := n.Int64(); int64(len(arr)) > max {
				return fmt.Errorf("%s: %d items, more than %d", at, len(arr), max)
			}
		}
	}
	if arr, ok := v.([]any); ok && s["items"] != nil {
		for i, x := range arr {
			if err := d.validate(s["items"], x, fmt.Sprintf("%s[%d]", at, i), observe); err != nil {
				return err
			}
		}
	}
	return nil
}

func asSlice(v any) []any { s, _ := v.([]any); return s }

func jsonTypeOf(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case string:
		return "string"
	case json.Number:
		if _, err := v.Int64(); err == nil {
			return "integer"
		}
		return "number"
	case []any:
		return "array"
	default:
		return "object"
	}
}

const (
	sandboxOrderJSON = `{"id":"ord_sbx_0001","merchant_reference":"SBX-ORDER-1001","platform":"shopify","status":"unfulfilled","shipment_id":null,"created_at":"2026-11-01T09:30:00Z"}`
	otherOrderJSON   = `{"id":"ord_other_0001","merchant_reference":"OTH-ORDER-1","platform":"etsy","status":"fulfilled","shipment_id":"shp_other_1","created_at":"2026-10-14T09:00:00Z"}`
)

// operations are the four v1 operations, each with a target its resource exists at for
// acct_sandbox/test, and the scope it needs.
var operations = []struct {
	name, target, scope string
}{
	{"tracking by id", "/v1/shipments/shp_sbx_spring/tracking", "tracking:read"},
	{"tracking by number", "/v1/tracking/SBX1000000001", "tracking:read"},
	{"list orders", "/v1/orders", "orders:read"},
	{"get order", "/v1/orders/ord_sbx_0001", "orders:read"},
}

// mustDecode decodes the JSON b into v, and stops the test when b is not what v reads: an
// assertion on what failed to decode would judge a zero value.
func mustDecode(t testing.TB, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("decoding %.300s: %v", b, err)
	}
}

// mustDecodeExact is mustDecode for an answer whose every member v names: a member v does
// not know stops the test too.
func mustDecodeExact(t testing.TB, b []byte, v any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
}

// orderJSON is an imported order as the API shows it.
type orderJSON struct {
	ID                string  `json:"id"`
	MerchantReference string  `json:"merchant_reference"`
	Platform          string  `json:"platform"`
	Status            string  `json:"status"`
	ShipmentID        *string `json:"shipment_id"`
	CreatedAt         string  `json:"created_at"`
}

type pageJSON struct {
	Data       []orderJSON `json:"data"`
	Pagination struct {
		Limit      int     `json:"limit"`
		NextCursor *string `json:"next_cursor"`
		HasMore    bool    `json:"has_more"`
	} `json:"pagination"`
}

func decodePage(t testing.TB, rep reply) pageJSON {
	t.Helper()
	if rep.status != 200 {
		t.Fatalf("list = %s, want 200", rep)
	}
	var p pageJSON
	mustDecodeExact(t, rep.body, &p)
	return p
}

// walk follows next_cursor from the first page of query to the last, checking each page's
// pagination object, and returns every order it saw.
func (e *env) walk(t testing.TB, key, query string, limit int) []orderJSON {
	t.Helper()
	var all []orderJSON
	cursor := ""
	for pages := 0; ; pages++ {
		if pages > 10000 {
			t.Fatal("the walk does not end")
		}
		q := query + "&limit=" + strconv.Itoa(limit)
		if cursor != "" {
			q += "&cursor=" + url.QueryEscape(cursor)
		}
		p := decodePage(t, e.get(t, "/v1/orders?"+q, key))
		if p.Pagination.Limit != limit {
			t.Fatalf("pagination.limit = %d, want the applied %d", p.Pagination.Limit, limit)
		}
		if len(p.Data) > limit {
			t.Fatalf("a page has %d orders, want at most its limit %d", len(p.Data), limit)
		}
		if p.Pagination.HasMore != (p.Pagination.NextCursor != nil) {
			t.Fatalf("has_more = %v with next_cursor %v, want has_more exactly when a next_cursor is given", p.Pagination.HasMore, p.Pagination.NextCursor)
		}
		if p.Pagination.HasMore && len(p.Data) != limit {
			t.Fatalf("a page with more after it has %d orders, want a full %d", len(p.Data), limit)
		}
		all = append(all, p.Data...)
		if !p.Pagination.HasMore {
			return all
		}
		cursor = *p.Pagination.NextCursor
	}
}

func ids(orders []orderJSON) []string {
	out := make([]string, len(orders))
	for i, o := range orders {
		out[i] = o.ID
	}
	return out
}

func firstDifference(a, b []string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// chunkedBody hides its length, so that net/http streams it chunked.
type chunkedBody struct{ io.Reader }

// neverEnding is an endless stream of one byte.
type neverEnding byte

func (b neverEnding) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(b)
	}
	return len(p), nil
}

// startRun starts run on a free port and returns its base URL, what it printed, and a
// function that stops it and returns run's error.
func startRun(t *testing.T, args ...string) (base string, stdout, stderr *lockedBuffer, stop func() error) {
	t.Helper()
	return startRunWithEnv(t, nil, nil, args...)
}

// startRunWithEnv is startRun with environment variables and the caller's heap tuner.
func startRunWithEnv(t *testing.T, env map[string]string, tuneHeap heapTuner, args ...string) (base string, stdout, stderr *lockedBuffer, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stdout, stderr = &lockedBuffer{}, &lockedBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"-addr", "127.0.0.1:0"}, args...), func(k string) string { return env[k] }, stdout, stderr, tuneHeap)
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if m := regexp.MustCompile(`Base URL: (\S+)`).FindStringSubmatch(stdout.String()); m != nil {
			base = m[1]
			break
		}
		select {
		case err := <-done:
			t.Fatalf("run returned %v before serving", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("run did not print its base URL")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return base, stdout, stderr, func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(20 * time.Second):
			return errors.New("run did not return after its context was cancelled")
		}
	}
}

// httpGet sends GET url over the network with the Authorization value auth and header
// pairs, and returns the status and body.
func httpGet(t *testing.T, url, auth string, headerPairs ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", auth)
	for i := 0; i+1 < len(headerPairs); i += 2 {
		req.Header.Set(headerPairs[i], headerPairs[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, string(body)
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("still waiting after 5s for %s", what)
		}
	}
}

// dataset assembles a small dataset from its four lists, each a JSON array's contents.
func dataset(accounts, keys, shipments, orders string) string {
	return `{"accounts":[` + accounts + `],"keys":[` + keys + `],"shipments":[` + shipments + `],"orders":[` + orders + `]}`
}

// writeTemp writes data to a file of the test's own and returns its path.
func writeTemp(t *testing.T, data string) string {
	t.Helper()
	path := t.TempDir() + "/data.json"
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

const (
	dsAccounts = `{"id":"acct_a","environments":["test"]},{"id":"acct_b","environments":["test","live"]}`
	dsKey      = `{"key":"sk_test_a","account":"acct_a","environment":"test","scopes":["orders:read"]}`
	dsOrder    = `{"id":"ord_1","account":"acct_a","environment":"test","merchant_reference":"R1","platform":"ebay","status":"fulfilled","created_at":"2026-11-01T00:00:00Z"}`
	dsShipment = `{"id":"shp_1","account":"acct_a","environment":"test","reference":"S1","tracking_number":"T1","events":[{"timestamp":"2026-11-01T00:00:00Z","status":"in_transit","description":"In transit"}]}`
)

// runtimeMem is the live heap after a full collection.
// heapGrowth serves n requests through h, request(i) the i-th, each to be answered want,
// and returns the bytes they leave on the heap once collected: what a bound of memory is
// tested by.
func heapGrowth(t *testing.T, h http.Handler, n, want int, request func(i int) *http.Request) int64 {
	t.Helper()
	w := &benchWriter{h: http.Header{}}
	before := heapAfterGC()
	for i := range n {
		r := request(i)
		clear(w.h)
		w.status, w.buf = 0, w.buf[:0]
		h.ServeHTTP(w, r)
		if w.status != want {
			t.Fatalf("request %d (%.80s) = %d, want %d", i, r.URL, w.status, want)
		}
	}
	return int64(heapAfterGC()) - int64(before)
}

// heapAfterGC is the heap's bytes once collected.
func heapAfterGC() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// readRequest is a request as net/http reads it off a connection: its method, target and
// headers cut from one fresh buffer.
func readRequest(t *testing.T, raw string) *http.Request {
	t.Helper()
	r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// gatedSink is a log destination whose writes wait at a gate until it is opened.
type gatedSink struct {
	gate    chan struct{} // closed: writes pass
	waiting atomic.Int32  // writes waiting at the gate
	lockedBuffer
}

func (s *gatedSink) Write(p []byte) (int, error) {
	s.waiting.Add(1)
	<-s.gate
	s.waiting.Add(-1)
	return s.lockedBuffer.Write(p)
}

func openSink() *gatedSink {
	s := &gatedSink{gate: make(chan struct{})}
	close(s.gate)
	return s
}

// stalledPipe is a pipe that nobody reads, filled to the brim before the sandbox starts:
// every write to it blocks, as to a terminal paused with Ctrl-S.
func stalledPipe(t *testing.T) *os.File {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	w.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
	for chunk := make([]byte, 4096); ; {
		if _, err := w.Write(chunk); err != nil {
			break
		}
	}
	w.SetWriteDeadline(time.Time{})
	return w
}

// busyCores saturates every core with other processes until the test ends.
func busyCores(t *testing.T) {
	t.Helper()
	for range runtime.NumCPU() {
		burn := exec.Command("sh", "-c", "while :; do :; done")
		if err := burn.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { burn.Process.Kill(); burn.Wait() })
	}
}

// sandboxBinary builds the sandbox once into a temporary directory, for the tests where a
// real process, its signals and its pipes are the point.
var sandboxBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "sandbox-test")
	if err != nil {
		return "", err
	}
	bin := dir + "/sandbox"
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
})

// startProcess starts the sandbox binary with args on a free port, its stderr to stderr,
// and returns it with its stdout, read line by line as it comes.
func startProcess(t *testing.T, stderr io.Writer, args ...string) (*exec.Cmd, *lockedBuffer) {
	t.Helper()
	bin, err := sandboxBinary()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append([]string{"-addr", "127.0.0.1:0", "-rate", "0"}, args...)...)
	stdout := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, stdout
}

// waitExit waits for cmd to exit and returns how long it took from since, and its status.
func waitExit(t *testing.T, cmd *exec.Cmd, since time.Time, limit time.Duration) (time.Duration, int) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
		return time.Since(since), cmd.ProcessState.ExitCode()
	case <-time.After(limit + 5*time.Second):
		t.Fatalf("the process had not exited %v after the signal", limit+5*time.Second)
		return 0, 0
	}
}

// loadedMargin is what a test of a time bound adds to it: a machine whose every core is busy,
// with a cold build cache, may take that much longer to schedule the way out. The bounds
// themselves are measured, and written in docs/development.md; a test holds that the way out
// is bounded at all, and not slower than a busy machine explains.
const loadedMargin = 20 * time.Second

// signalAndWait sends cmd SIGTERM while it is doing what, and wants it to exit 1 within
// bound (and loadedMargin): its outputs are stalled, so lines were lost.
func signalAndWait(t *testing.T, cmd *exec.Cmd, what string, bound time.Duration) {
	t.Helper()
	signalled := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	took, status := waitExit(t, cmd, signalled, bound+loadedMargin)
	t.Logf("exited %v after the signal, status %d (the bound: %v)", took, status, bound)
	if took > bound+loadedMargin || status != 1 {
		t.Errorf("stalled outputs, busy cores, a signal while %s: exit status %d after %v; want 1 within %v and the margin of a busy machine", what, status, took, bound)
	}
}

// benchWriter copies the body into a reused buffer, as a connection's buffered writer
// would, so that an answer's size costs what it costs; it allocates nothing itself. Its
// header map is reused (net/http makes one per response): the bare floor and the full
// chain are treated alike.
type benchWriter struct {
	h      http.Header
	status int
	buf    []byte
}

func (w *benchWriter) Header() http.Header { return w.h }

func (w *benchWriter) WriteHeader(s int) { w.status = s }

func (w *benchWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	w.buf = append(w.buf, b...)
	return len(b), nil
}

// benchEnv is a sandbox with seed orders, the default rate limit off (as the end-to-end
// benchmark runs it), the log and the journal on.
func benchEnv(b *testing.B, seed int) *env { return benchEnvOf(b, defaultDataset, seed, testNow) }

// benchEnvOf is benchEnv of a dataset, started at start.
func benchEnvOf(b *testing.B, data []byte, seed int, start time.Time) *env {
	b.Helper()
	sb, err := loadBytes("bench", data, seed, start, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	s, err := newServer(sb, serverOptions{access: newLogBuffer(io.Discard, time.Hour), journal: defaultJournal})
	if err != nil {
		b.Fatal(err)
	}
	return &env{h: s.handler(), srv: s, sb: sb}
}

// benchServe serves r repeatedly and reports the answer's size.
func benchServe(b *testing.B, h http.Handler, r *http.Request, want int) {
	b.Helper()
	r.RequestURI = r.URL.RequestURI() // as a server reads it off the request line
	w := &benchWriter{h: http.Header{}}
	h.ServeHTTP(w, r)
	if w.status != want {
		b.Fatalf("%s %s = %d, want %d", r.Method, r.URL, w.status, want)
	}
	b.SetBytes(int64(len(w.buf)))
	b.ReportAllocs()
	runtime.GC() // not the start-up's garbage: what a page costs when serving
	b.ResetTimer()
	for b.Loop() {
		clear(w.h)
		w.status, w.buf = 0, w.buf[:0]
		h.ServeHTTP(w, r)
	}
}

// BenchmarkBare is the floor: a handler that only writes a precomputed body, of the sizes
// of the answers above (an order, a tracking view, a page of 100 seeded orders).
func BenchmarkBare(b *testing.B) {
	for _, size := range []int{len(sandboxOrderJSON), 658, 16541} {
		b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) {
			body := []byte(strings.Repeat("x", size))
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.Write(body)
			})
			benchServe(b, h, newRequest("GET", "/v1/orders/ord_sbx_0001", "sk_test_sandbox_all"), 200)
		})
	}
}

// TestEveryFileListsItsSections: each file's header lists its banners ('// ===== Title ====='),
// all of them, in their order: a reader searches the code by them.
func TestEveryFileListsItsSections(t *testing.T) {
	t.Parallel()
	files, _ := filepath.Glob("*.go")
	for _, name := range files {
		text, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		header, _, _ := strings.Cut(string(text), "\npackage main")
		var listed, banners []string
		for _, m := range regexp.MustCompile(`(?m)^//   - (.*)$`).FindAllStringSubmatch(header, -1) {
			listed = append(listed, m[1])
		}
		for _, m := range regexp.MustCompile(`(?m)^// ===== (.*) =====$`).FindAllStringSubmatch(string(text), -1) {
			banners = append(banners, m[1])
		}
		if len(banners) == 0 || !slices.Equal(listed, banners) {
			t.Errorf("%s's header lists\n%s\nits banners are\n%s", name, strings.Join(listed, "\n"), strings.Join(banners, "\n"))
		}
	}
}

// ===== main.go, serve: the process (flags and environment, hosts and origins, loading, serving and the way out, the collector) =====

// main.go, the process: the way out, flags and run, loading a dataset, shutdown, memory.

// TestTheWayOutIsBoundedInTheWorstArrangement (first of all: its 15 s of waiting is what the
// other tests overlap): stdout and stderr are one pipe that nobody
// reads, and every core is busy. A signal while serving ends the process within 15 s, and
// a signal while loading within 2 s, each a deadline from the signal; the lines that could
// not be written are lost and the exit status is 1.
func TestTheWayOutIsBoundedInTheWorstArrangement(t *testing.T) {
	t.Parallel()
	bin, err := sandboxBinary()
	if err != nil {
		t.Fatal(err)
	}
	start := func(t *testing.T, args ...string) (*exec.Cmd, string) {
		free, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := free.Addr().String()
		free.Close()
		out := stalledPipe(t)
		cmd := exec.Command(bin, append([]string{"-addr", addr, "-rate", "0"}, args...)...)
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd, addr
	}
	t.Run("serving", func(t *testing.T) {
		t.Parallel()
		cmd, addr := start(t)
		client := &http.Client{Timeout: time.Second}
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if res, err := client.Get("http://" + addr + "/healthz"); err == nil {
				res.Body.Close()
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the sandbox did not serve within 20 s while its outputs were stalled")
			}
		}
		for range 200 {
			if status, _ := httpGet(t, "http://"+addr+"/v1/orders", "Bearer sk_test_sandbox_all"); status != 200 {
				t.Fatalf("GET /v1/orders = %d, want 200", status)
			}
		}
		busyCores(t)
		signalAndWait(t, cmd, "serving", 15*time.Second)
	})
	t.Run("loading", func(t *testing.T) {
		t.Parallel()
		busyCores(t)
		cmd, addr := start(t, "-seed-orders", "5000000")
		time.Sleep(500 * time.Millisecond)
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			t.Fatal("the sandbox serves already: no signal during loading can be tried")
		}
		signalAndWait(t, cmd, "loading", 2*time.Second)
	})
	// A -data file is read under the same bound: a FIFO nobody writes blocks opening it,
	// one whose writer stalls blocks reading it.
	t.Run("opening a FIFO", func(t *testing.T) {
		t.Parallel()
		busyCores(t)
		fifo := newFIFO(t)
		cmd, _ := start(t, "-data", fifo)
		time.Sleep(500 * time.Millisecond)
		signalAndWait(t, cmd, "opening a FIFO nobody writes", 2*time.Second)
	})
	t.Run("reading a FIFO", func(t *testing.T) {
		t.Parallel()
		busyCores(t)
		fifo := newFIFO(t)
		cmd, _ := start(t, "-data", fifo)
		w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		w.WriteString(`{"accounts":[{"id":"acct_a","environments":["test"]},`)
		time.Sleep(500 * time.Millisecond)
		signalAndWait(t, cmd, "reading a FIFO whose writer stalls", 2*time.Second)
	})
}

func TestParseConfig(t *testing.T) {
	t.Parallel()
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	// settings is what a config says, as a comparable value.
	type settings struct {
		addr, addrName, dataName, dataFile, cursorSecret, corsOrigin string
		rate, seedOrders, journal                                    int
		clock, faults                                                string
	}
	settingsOf := func(c config) settings {
		s := settings{c.addr, c.addrName, c.dataName, c.dataFile, c.cursorSecret, c.corsOrigin, c.rate, c.seedOrders, c.journal, "", ""}
		if c.clock != nil {
			s.clock = formatTimestamp(*c.clock)
		}
		if c.faults != nil {
			var codes []string
			for _, a := range c.faults.answers {
				codes = append(codes, a.status)
			}
			s.faults = fmt.Sprintf("rate %d/1000000, codes %s, seed %d", c.faults.rate, strings.Join(codes, "|"), c.faults.seed)
		}
		return s
	}
	defaults := settings{addr: "127.0.0.1:8080", addrName: "-addr", dataName: "-data", rate: 25, journal: 1000}
	with := func(change func(*settings)) settings { s := defaults; change(&s); return s }
	for _, tt := range []struct {
		name   string
		args   []string
		getenv func(string) string
		want   settings
	}{
		{"defaults", nil, env(), defaults},
		{"flags", []string{"-addr", ":9090", "-rate", "0", "-seed-orders", "1000", "-data", "x.json", "-cursor-secret", "s"}, env(), with(func(s *settings) {
			s.addr, s.rate, s.seedOrders, s.dataFile, s.cursorSecret = ":9090", 0, 1000, "x.json", "s"
		})},
		{"environment fallbacks", nil, env("SANDBOX_ADDR", ":1", "SANDBOX_RATE", "7", "SANDBOX_SEED_ORDERS", "3", "SANDBOX_DATA", "d.json", "SANDBOX_CURSOR_SECRET", "e", "SANDBOX_CLOCK", "2026-03-29T02:30:00+01:00"), with(func(s *settings) {
			s.addr, s.addrName, s.rate, s.seedOrders, s.dataFile, s.dataName, s.cursorSecret, s.clock = ":1", "SANDBOX_ADDR", 7, 3, "d.json", "SANDBOX_DATA", "e", "2026-03-29T01:30:00Z"
		})},
		{"-clock", []string{"-clock", "2026-11-23T10:00:00Z"}, env(), with(func(s *settings) { s.clock = "2026-11-23T10:00:00Z" })},
		{"an origin", []string{"-cors-origin", "https://app.example.com:8443"}, env(), with(func(s *settings) { s.corsOrigin = "https://app.example.com:8443" })},
		{"an IPv6 origin", []string{"-cors-origin", "http://[::1]:3000"}, env(), with(func(s *settings) { s.corsOrigin = "http://[::1]:3000" })},
		{"any origin", []string{"-cors-origin", "*"}, env(), with(func(s *settings) { s.corsOrigin = "*" })},
		{"faults", []string{"-faults", "rate=0.05,codes=503|429,seed=7"}, env(), with(func(s *settings) { s.faults = "rate 50000/1000000, codes 503|429, seed 7" })},
		{"faults by default", []string{"-faults", "rate=1.0"}, env(), with(func(s *settings) { s.faults = "rate 1000000/1000000, codes 503, seed 1" })},
		{"faults at a millionth", nil, env("SANDBOX_FAULTS", "seed=18446744073709551615,rate=0.000001,codes=500"), with(func(s *settings) {
			s.faults = "rate 1/1000000, codes 500, seed 18446744073709551615"
		})},
		{"no faults", []string{"-faults", "rate=0"}, env(), with(func(s *settings) { s.faults = "rate 0/1000000, codes 503, seed 1" })},
		{"no journal", []string{"-journal", "0"}, env(), with(func(s *settings) { s.journal = 0 })},
		{"the longest journal", nil, env("SANDBOX_JOURNAL", "100000"), with(func(s *settings) { s.journal = 100000 })},
		{"a flag beats its variable", []string{"-rate", "9", "-addr", ":2"}, env("SANDBOX_RATE", "fast", "SANDBOX_ADDR", ":3"), with(func(s *settings) { s.rate, s.addr = 9, ":2" })},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseConfig(tt.args, tt.getenv, io.Discard)
			if got := settingsOf(c); err != nil || got != tt.want {
				t.Errorf("parseConfig(%q) = %+v, %v; want %+v", tt.args, got, err, tt.want)
			}
		})
	}
	const origin = `want one origin such as http://localhost:3000, or *`
	for _, tt := range []struct {
		args   []string
		getenv func(string) string
		want   string
	}{
		{[]string{"-rate", "fast"}, env(), `invalid value "fast" for flag -rate: want a whole number from 0 to 1000000000`},
		{[]string{"-rate", "-1"}, env(), `invalid value "-1" for flag -rate: want a whole number from 0 to 1000000000`},
		{[]string{"-rate", "2.5"}, env(), `invalid value "2.5" for flag -rate: want a whole number from 0 to 1000000000`},
		{[]string{"-seed-orders", "-5"}, env(), `invalid value "-5" for flag -seed-orders: want a whole number from 0 to 5000000`},
		{[]string{"-seed-orders", "5000001"}, env(), `invalid value "5000001" for flag -seed-orders: want a whole number from 0 to 5000000`},
		{[]string{"-port", "1"}, env(), `flag provided but not defined: -port (see -h for the flags)`},
		{[]string{"serve"}, env(), `unexpected argument "serve": the sandbox takes flags only (see -h)`},
		{nil, env("SANDBOX_RATE", "fast"), `invalid value "fast" for SANDBOX_RATE (the fallback of -rate): want a whole number from 0 to 1000000000`},
		{[]string{"-faults", ""}, env(), `invalid value "" for flag -faults: "" is not a part of it: want rate=R,codes=C|C,seed=S, such as rate=0.05,codes=503|429,seed=7`},
		{[]string{"-faults", "codes=503"}, env(), `invalid value "codes=503" for flag -faults: rate is required, such as rate=0.05`},
		{[]string{"-faults", "rate=1.5"}, env(), `invalid value "rate=1.5" for flag -faults: rate=1.5 is not a rate from 0 to 1 written as digits, then optionally a point and 1 to 6 digits (0, 0.05, 1.0)`},
		{[]string{"-faults", "rate=0.0000001"}, env(), `invalid value "rate=0.0000001" for flag -faults: rate=0.0000001 is not a rate from 0 to 1 written as digits, then optionally a point and 1 to 6 digits (0, 0.05, 1.0)`},
		{[]string{"-faults", "rate=.5"}, env(), `invalid value "rate=.5" for flag -faults: rate=.5 is not a rate from 0 to 1 written as digits, then optionally a point and 1 to 6 digits (0, 0.05, 1.0)`},
		{[]string{"-faults", "rate=0."}, env(), `invalid value "rate=0." for flag -faults: rate=0. is not a rate from 0 to 1 written as digits, then optionally a point and 1 to 6 digits (0, 0.05, 1.0)`},
		{[]string{"-faults", "rate=-0.1"}, env(), `invalid value "rate=-0.1" for flag -faults: rate=-0.1 is not a rate from 0 to 1 written as digits, then optionally a point and 1 to 6 digits (0, 0.05, 1.0)`},
		{[]string{"-faults", "rate=0.1,codes=418"}, env(), `invalid value "rate=0.1,codes=418" for flag -faults: codes=418: each code is one of 429, 500, 502, 503, none twice, separated by |`},
		{[]string{"-faults", "rate=0.1,codes=503|503"}, env(), `invalid value "rate=0.1,codes=503|503" for flag -faults: codes=503|503: each code is one of 429, 500, 502, 503, none twice, separated by |`},
		{[]string{"-faults", "rate=0.1,seed=-1"}, env(), `invalid value "rate=0.1,seed=-1" for flag -faults: seed=-1 is not a whole number from 0 to 18446744073709551615`},
		{[]string{"-faults", "rate=0.1,seed=18446744073709551616"}, env(), `invalid value "rate=0.1,seed=18446744073709551616" for flag -faults: seed=18446744073709551616 is not a whole number from 0 to 18446744073709551615`},
		{[]string{"-faults", "rate=0.1,rate=0.2"}, env(), `invalid value "rate=0.1,rate=0.2" for flag -faults: rate is given twice`},
		{[]string{"-faults", "rate=0.1, seed=2"}, env(), `invalid value "rate=0.1, seed=2" for flag -faults: " seed=2" is not a part of it: want rate=R,codes=C|C,seed=S, such as rate=0.05,codes=503|429,seed=7`},
		{nil, env("SANDBOX_FAULTS", "rate=2"), `invalid value "rate=2" for SANDBOX_FAULTS (the fallback of -faults): rate=2 is not a rate from 0 to 1 written as digits, then optionally a point and 1 to 6 digits (0, 0.05, 1.0)`},
		{[]string{"-cors-origin", "localhost:3000"}, env(), `invalid value "localhost:3000" for flag -cors-origin: ` + origin},
		{[]string{"-cors-origin", "http://localhost:3000/app"}, env(), `invalid value "http://localhost:3000/app" for flag -cors-origin: ` + origin},
		{[]string{"-cors-origin", "http://localhost:99999"}, env(), `invalid value "http://localhost:99999" for flag -cors-origin: ` + origin},
		{[]string{"-cors-origin", "http://..."}, env(), `invalid value "http://..." for flag -cors-origin: ` + origin},
		{[]string{"-cors-origin", "http://[:]"}, env(), `invalid value "http://[:]" for flag -cors-origin: ` + origin},
		{[]string{"-cors-origin", "http://-"}, env(), `invalid value "http://-" for flag -cors-origin: ` + origin},
		{[]string{"-cors-origin", "http://x:0"}, env(), `invalid value "http://x:0" for flag -cors-origin: ` + origin},
		{[]string{"-cors-origin", "http://LOCALHOST:3000"}, env(), `invalid value "http://LOCALHOST:3000" for flag -cors-origin: ` + origin},
		{[]string{"-cors-origin", "http://localhost:80"}, env(), `invalid value "http://localhost:80" for flag -cors-origin: ` + origin},
		{[]string{"-cors-origin", "https://app.test:443"}, env(), `invalid value "https://app.test:443" for flag -cors-origin: ` + origin},
		{[]string{"-cors-origin", "ftp://localhost:3000"}, env(), `invalid value "ftp://localhost:3000" for flag -cors-origin: ` + origin},
		{[]string{"-clock", "2026-11-23 10:00"}, env(), `invalid value "2026-11-23 10:00" for flag -clock: want an RFC 3339 timestamp with an offset, such as 2026-03-29T01:00:00Z`},
		{nil, env("SANDBOX_CLOCK", "now"), `invalid value "now" for SANDBOX_CLOCK (the fallback of -clock): want an RFC 3339 timestamp with an offset, such as 2026-03-29T01:00:00Z`},
		{nil, env("SANDBOX_SEED_ORDERS", "many"), `invalid value "many" for SANDBOX_SEED_ORDERS (the fallback of -seed-orders): want a whole number from 0 to 5000000`},
		{[]string{"-journal", "100001"}, env(), `invalid value "100001" for flag -journal: want a whole number from 0 to 100000`},
		{nil, env("SANDBOX_JOURNAL", "-1"), `invalid value "-1" for SANDBOX_JOURNAL (the fallback of -journal): want a whole number from 0 to 100000`},
	} {
		t.Run(caseName(strings.Join(tt.args, " ")+" "+tt.want), func(t *testing.T) {
			_, err := parseConfig(tt.args, tt.getenv, io.Discard)
			if got := fmt.Sprint(err); got != tt.want {
				t.Errorf("parseConfig(%q) error = %s, want %s", tt.args, got, tt.want)
			}
		})
	}
	var usage bytes.Buffer
	if err := run(context.Background(), []string{"-h"}, env(), &usage, io.Discard, nil); err != nil || !strings.Contains(usage.String(), "-seed-orders") || !strings.Contains(usage.String(), "SANDBOX_") {
		t.Errorf("run -h = %v, printed %q; want nil and the flags", err, usage.String())
	}
}

// TestNextAddress: an address in use suggests the port after the one asked for, on its host.
func TestNextAddress(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]string{
		"127.0.0.1:8080": "127.0.0.1:8081", ":9000": ":9001", "localhost:80": "localhost:81",
		"[::1]:8080": "[::1]:8081", "0.0.0.0:65535": "0.0.0.0:65534", "nonsense": "127.0.0.1:8081",
	} {
		if got := nextAddress(addr); got != want {
			t.Errorf("nextAddress(%q) = %q, want %q", addr, got, want)
		}
	}
}

func TestRunRefusesABadStart(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	port := taken.Addr().(*net.TCPAddr).Port
	next := "127.0.0.1:" + strconv.Itoa(port+1) // the port after the one asked for
	if port == 65535 {
		next = "127.0.0.1:65534"
	}
	tests := []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"-addr", taken.Addr().String()}, nil, "-addr " + taken.Addr().String() + ": listen tcp " + taken.Addr().String() + ": bind: address already in use: another process listens there (another sandbox, perhaps): stop it, or pass another -addr, such as -addr " + next},
		{nil, map[string]string{"SANDBOX_ADDR": taken.Addr().String()}, "SANDBOX_ADDR " + taken.Addr().String() + ": listen tcp " + taken.Addr().String() + ": bind: address already in use: another process listens there (another sandbox, perhaps): stop it, or set SANDBOX_ADDR to another address, such as " + next},
		{[]string{"-addr", "nonsense"}, nil, "-addr nonsense: listen tcp: address nonsense: missing port in address"},
		{[]string{"-data", "testdata/no-such-file.json"}, nil, "-data: open testdata/no-such-file.json: no such file or directory"},
		{nil, map[string]string{"SANDBOX_DATA": "missing.json"}, "SANDBOX_DATA: open missing.json: no such file or directory"},
		{[]string{"-data", "missing.json"}, map[string]string{"SANDBOX_DATA": "other.json"}, "-data: open missing.json: no such file or directory"},
		{[]string{"-h2"}, nil, "flag provided but not defined: -h2 (see -h for the flags)"},
		{[]string{"-seed-orders", "-5"}, nil, `invalid value "-5" for flag -seed-orders: want a whole number from 0 to 5000000`},
	}
	for _, tt := range tests {
		t.Run(caseName(strings.Join(tt.args, " ")+" "+fmt.Sprint(tt.env)), func(t *testing.T) {
			err := run(context.Background(), tt.args, func(k string) string { return tt.env[k] }, io.Discard, io.Discard, nil)
			if err == nil || err.Error() != tt.want {
				t.Errorf("run(%q, %v) = %v, want %s", tt.args, tt.env, err, tt.want)
			}
		})
	}
}

// TestRunServesTheDefaultSandbox is the README's first use: go run ., then curl.
func TestRunServesTheDefaultSandbox(t *testing.T) {
	t.Parallel()
	base, stdout, stderr, stop := startRun(t)
	if !strings.HasPrefix(base, "http://127.0.0.1:") || !strings.HasSuffix(base, "/v1") {
		t.Errorf("base URL %q, want http://127.0.0.1:<port>/v1", base)
	}
	for _, key := range []string{"sk_test_sandbox_all", "sk_test_sandbox_tracking", "sk_test_sandbox_orders", "sk_test_sandbox_none", "sk_test_sandbox_expired", "sk_test_sandbox_revoked", "sk_test_other_all", "sk_live_sandbox_all"} {
		if !strings.Contains(stdout.String(), key) {
			t.Errorf("start-up output does not list key %s:\n%s", key, stdout)
		}
	}
	// The page for a browser, the base URL for clients; no line sends a browser to /v1.
	origin := strings.TrimSuffix(base, "/v1")
	for _, line := range strings.Split(stdout.String(), "\n") {
		if strings.Contains(line, "browser") && (!strings.HasPrefix(line, "In a browser: "+origin+"/ ") || strings.Contains(line, "/v1")) {
			t.Errorf("the banner's line for a browser is %q, want it to name %s/ and no /v1", line, origin)
		}
	}
	if !strings.HasPrefix(stdout.String(), "Loading the embedded default dataset...\n") {
		t.Errorf("start-up does not say what it loads:\n%s", stdout)
	}
	if !strings.Contains(stdout.String(), "Base URL: "+base+" for API clients") {
		t.Errorf("the banner has no line with the base URL for clients:\n%s", stdout)
	}
	if !regexp.MustCompile(`sk_test_sandbox_expired +acct_sandbox/test +tracking:read orders:read +expired 2026-01-01T00:00:00Z\n`).MatchString(stdout.String()) {
		t.Errorf("the banner does not say sk_test_sandbox_expired has expired:\n%s", stdout)
	}
	status, body := httpGet(t, base+"/orders", "Bearer sk_test_sandbox_all")
	if want := `{"data":[` + sandboxOrderJSON + `],"pagination":{"limit":20,"next_cursor":null,"has_more":false}}`; status != 200 || body != want {
		t.Errorf("GET %s/orders = %d %s, want 200 %s", base, status, body, want)
	}
	res, err := http.Get(base + "/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Servers []struct{ URL string } `json:"servers"`
	}
	json.NewDecoder(res.Body).Decode(&doc)
	res.Body.Close()
	if len(doc.Servers) != 1 || doc.Servers[0].URL != base {
		t.Errorf("served OpenAPI servers = %+v, want the running base URL %s", doc.Servers, base)
	}
	if err := stop(); err != nil {
		t.Errorf("run = %v after its context was cancelled, want nil", err)
	}
	// The fixtures drop raw events on purpose: a default start warns of nothing.
	if log := stderr.String(); strings.Contains(log, `"level":"WARN"`) || strings.Contains(log, `"level":"ERROR"`) ||
		!strings.Contains(log, `"level":"INFO","msg":"dataset: raw events dropped, as this fixture means to show: timestamp not RFC 3339 with an offset","shipment":"shp_sbx_naive"`) {
		t.Errorf("a default start logged a warning, or not the naive fixture's dropped events at INFO:\n%s", log)
	}
}

// TestMainExitsNonZero runs main in a child process: a refused start prints one line that
// names the flag and exits 1; flags unsafe together (any page's origin, with a key that a
// request without Authorization acts as) exit 2.
func TestMainExitsNonZero(t *testing.T) {
	t.Parallel()
	if args := os.Getenv("SANDBOX_TEST_MAIN_ARGS"); args != "" {
		os.Args = append([]string{"sandbox"}, strings.Fields(args)...)
		main()
		return
	}
	for args, want := range map[string]struct {
		status int
		line   string
	}{
		"-rate fast":         {1, `sandbox: invalid value "fast" for flag -rate: want a whole number from 0 to 1000000000`},
		"-seed-orders -5":    {1, `sandbox: invalid value "-5" for flag -seed-orders: want a whole number from 0 to 5000000`},
		"-data nowhere.json": {1, `sandbox: -data: open nowhere.json: no such file or directory`},
		"-cors-origin * -mcp-key sk_test_sandbox_all":                   {2, `sandbox: -cors-origin '*' with -mcp-key: any web page could then drive the MCP door as that key (a page's request carries no Authorization, and acts as -mcp-key); name your app's origin with -cors-origin, or drop -mcp-key`},
		"-addr 127.0.0.1:0 -mcp-key sk_test_sandbox_all -cors-origin *": {2, `sandbox: -cors-origin '*' with -mcp-key: any web page could then drive the MCP door as that key (a page's request carries no Authorization, and acts as -mcp-key); name your app's origin with -cors-origin, or drop -mcp-key`},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestMainExitsNonZero$")
		cmd.Env = append(os.Environ(), "SANDBOX_TEST_MAIN_ARGS="+args)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != want.status || strings.TrimSpace(stderr.String()) != want.line {
			t.Errorf("sandbox %s: %v, stderr %q; want exit %d and %q", args, err, stderr.String(), want.status, want.line)
		}
	}
	_, err := parseConfig(nil, func(name string) string {
		return map[string]string{"SANDBOX_CORS_ORIGIN": "*", "SANDBOX_MCP_KEY": "sk_test_sandbox_all"}[name]
	}, io.Discard)
	if want := "SANDBOX_CORS_ORIGIN '*' with SANDBOX_MCP_KEY: "; !strings.HasPrefix(fmt.Sprint(err), want) {
		t.Errorf("from the environment: %v, want %q...", err, want)
	}
}

// TestRunWithADatasetFile: -data serves the user's dataset; a bad file is refused by run
// with its name, the JSON path and the reason.
func TestRunWithADatasetFile(t *testing.T) {
	t.Parallel()
	base, stdout, _, stop := startRun(t, "-data", "testdata/example.json")
	status, body := httpGet(t, base+"/orders/ord_acme_2", "Bearer sk_test_acme_all")
	want := `{"id":"ord_acme_2","merchant_reference":"ACME-1002","platform":"ebay","status":"fulfilled","shipment_id":"shp_acme_1","created_at":"2026-11-09T16:20:00Z"}`
	if status != 200 || body != want {
		t.Errorf("GET ord_acme_2 from testdata/example.json = %d %s, want 200 %s", status, body, want)
	}
	if !strings.Contains(stdout.String(), "sk_test_acme_all") || strings.Contains(stdout.String(), "sk_test_sandbox_all") ||
		!strings.HasPrefix(stdout.String(), "Loading testdata/example.json...\n") {
		t.Errorf("start-up lists the wrong keys for -data, or does not say what it loads:\n%s", stdout)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	bad := t.TempDir() + "/bad.json"
	os.WriteFile(bad, []byte(dataset(dsAccounts, "", "", strings.Replace(dsOrder, `"ebay"`, `"woocommerce"`, 1))), 0o644)
	err := run(context.Background(), []string{"-addr", "127.0.0.1:0", "-data", bad}, func(string) string { return "" }, io.Discard, io.Discard, nil)
	if want := "dataset " + bad + `: $.orders[0].platform: unknown platform "woocommerce"; want one of amazon, ebay, etsy, shopify, tiktok_shop`; err == nil || err.Error() != want {
		t.Errorf("run -data bad.json = %v, want %s", err, want)
	}
	err = run(context.Background(), []string{"-addr", "127.0.0.1:0"}, func(k string) string { return map[string]string{"SANDBOX_DATA": bad}[k] }, io.Discard, io.Discard, nil)
	if err == nil || !strings.HasPrefix(err.Error(), "dataset "+bad+": $.orders[0].platform") {
		t.Errorf("run with SANDBOX_DATA=bad.json = %v, want the dataset refused", err)
	}
}

// TestDatasetRefusals: a dataset that cannot be served is refused with the file, the JSON
// path of the fault and the reason.
func TestDatasetRefusals(t *testing.T) {
	t.Parallel()
	ship := func(id, orderID string) string {
		return `{"id":"` + id + `","account":"acct_a","environment":"test","reference":"S","order_id":"` + orderID + `"}`
	}
	tests := []struct {
		name, data, want string
	}{
		{"truncated JSON", `{"accounts": [`, `$: invalid JSON at line 1, column 15: unexpected end of file`},
		{"broken JSON", "{\n  \"accounts\": [}\n", `$: invalid JSON at line 2, column 16: invalid character '}' looking for beginning of value`},
		{"not an object", `[1,2]`, `$: must be an object, not array`},
		{"data after the object", dataset(dsAccounts, "", "", "") + `{}`, `$: unexpected data after the dataset object`},
		{"unknown top-level field", `{"accounts":[` + dsAccounts + `],"users":[]}`, `$.users: unknown field`},
		{"no accounts", dataset("", "", "", ""), `$.accounts: at least one account is required`},
		{"account without environments", dataset(`{"id":"acct_a","environments":[]}`, "", "", ""), `$.accounts[0].environments: at least one environment (test or live) is required`},
		{"unknown environment", dataset(`{"id":"acct_a","environments":["staging"]}`, "", "", ""), `$.accounts[0].environments[0]: unknown environment "staging"; want one of test, live`},
		{"duplicate account", dataset(dsAccounts+`,{"id":"acct_a","environments":["test"]}`, "", "", ""), `$.accounts[2].environments[0]: duplicate: acct_a/test is declared more than once`},
		{"unknown field in an account", dataset(`{"id":"acct_a","environments":["test"],"name":"A"}`, "", "", ""), `$.accounts[0].name: unknown field`},
		{"key with no account", dataset(dsAccounts, `{"key":"sk_x","environment":"test","scopes":[]}`, "", ""), `$.keys[0].account: required, and must not be empty`},
		{"key of an undeclared account", dataset(dsAccounts, `{"key":"sk_x","account":"acct_z","environment":"test","scopes":[]}`, "", ""), `$.keys[0].account: account "acct_z" is not declared in $.accounts`},
		{"key of an undeclared environment", dataset(dsAccounts, `{"key":"sk_x","account":"acct_a","environment":"live","scopes":[]}`, "", ""), `$.keys[0].environment: account "acct_a" declares no environment "live" in $.accounts`},
		{"unknown scope", dataset(dsAccounts, `{"key":"sk_x","account":"acct_a","environment":"test","scopes":["orders:read","orders:write"]}`, "", ""), `$.keys[0].scopes[1]: unknown scope "orders:write"; want one of tracking:read, orders:read`},
		{"duplicate key", dataset(dsAccounts, dsKey+`,`+strings.Replace(dsKey, "acct_a", "acct_b", 1), "", ""), `$.keys[1].key: duplicate: the same key as $.keys[0]`},
		{"empty key", dataset(dsAccounts, `{"key":"","account":"acct_a","environment":"test","scopes":[]}`, "", ""), `$.keys[0].key: required, and must not be empty`},
		{"key that cannot be sent", dataset(dsAccounts, `{"key":"sk test","account":"acct_a","environment":"test","scopes":[]}`, "", ""), `$.keys[0].key: not sendable as a Bearer credential: use letters, digits and - . _ ~ + / (then = padding only)`},
		{"key expiry without offset", dataset(dsAccounts, `{"key":"sk_x","account":"acct_a","environment":"test","scopes":[],"expires_at":"2026-01-01T00:00:00"}`, "", ""), `$.keys[0].expires_at: "2026-01-01T00:00:00" is not an RFC 3339 timestamp with an offset and a four-digit year, such as 2026-11-01T09:30:00Z`},
		{"unknown order status", dataset(dsAccounts, "", "", strings.Replace(dsOrder, `"fulfilled"`, `"shipped"`, 1)), `$.orders[0].status: unknown order status "shipped"; want one of unfulfilled, partially_fulfilled, fulfilled, cancelled`},
		{"unknown platform", dataset(dsAccounts, "", "", strings.Replace(dsOrder, `"ebay"`, `"woocommerce"`, 1)), `$.orders[0].platform: unknown platform "woocommerce"; want one of amazon, ebay, etsy, shopify, tiktok_shop`},
		{"order created_at without offset", dataset(dsAccounts, "", "", strings.Replace(dsOrder, `00:00:00Z`, `00:00:00`, 1)), `$.orders[0].created_at: "2026-11-01T00:00:00" is not an instant: RFC 3339 with an offset (2026-11-01T09:30:00Z), or relative to the start instant (start, start+90s, start-10m, start+1h30m)`},
		{"order created_at not a string", dataset(dsAccounts, "", "", strings.Replace(dsOrder, `"2026-11-01T00:00:00Z"`, `1762000000`, 1)), `$.orders[0].created_at: must be a string, not number`},
		{"order shipment_id set directly", dataset(dsAccounts, "", "", strings.Replace(dsOrder, `"status"`, `"shipment_id":"shp_1","status"`, 1)), `$.orders[0].shipment_id: unknown field`},
		{"duplicate order id", dataset(dsAccounts, "", "", dsOrder+","+dsOrder), `$.orders[1].id: duplicate order id "ord_1" in acct_a/test`},
		{"order of an undeclared account", dataset(dsAccounts, "", "", strings.Replace(dsOrder, "acct_a", "acct_z", 1)), `$.orders[0].account: account "acct_z" is not declared in $.accounts`},
		{"order of an undeclared environment", dataset(dsAccounts, "", "", strings.Replace(dsOrder, `"test"`, `"live"`, 1)), `$.orders[0].environment: account "acct_a" declares no environment "live" in $.accounts`},
		{"order without merchant_reference", dataset(dsAccounts, "", "", strings.Replace(dsOrder, `"R1"`, `""`, 1)), `$.orders[0].merchant_reference: required, and must not be empty`},
		{"unknown event status", dataset(dsAccounts, "", strings.Replace(dsShipment, `"in_transit"`, `"lost"`, 1), ""), `$.shipments[0].events[0].status: unknown tracking status "lost"; want one of pre_transit, in_transit, out_for_delivery, available_for_pickup, delivered, return_to_sender, failure, cancelled, unknown`},
		{"unknown event field", dataset(dsAccounts, "", strings.Replace(dsShipment, `"description"`, `"carrier":"x","description"`, 1), ""), `$.shipments[0].events[0].carrier: unknown field`},
		{"event without description", dataset(dsAccounts, "", strings.Replace(dsShipment, `,"description":"In transit"`, ``, 1), ""), `$.shipments[0].events[0].description: required`},
		{"shipment without reference", dataset(dsAccounts, "", strings.Replace(dsShipment, `"S1"`, `""`, 1), ""), `$.shipments[0].reference: required, and must not be empty`},
		{"empty tracking number", dataset(dsAccounts, "", strings.Replace(dsShipment, `"T1"`, `""`, 1), ""), `$.shipments[0].tracking_number: must not be empty; use null for a shipment without a tracking number`},
		{"duplicate shipment id", dataset(dsAccounts, "", dsShipment+","+dsShipment, ""), `$.shipments[1].id: duplicate shipment id "shp_1" in acct_a/test`},
		{"shipment of an undeclared account", dataset(dsAccounts, "", strings.Replace(dsShipment, "acct_a", "acct_z", 1), ""), `$.shipments[0].account: account "acct_z" is not declared in $.accounts`},
		{"order linked twice", dataset(dsAccounts, "", ship("shp_1", "ord_1")+","+ship("shp_2", "ord_1"), dsOrder), `$.shipments[1].order_id: order "ord_1" is already linked to shipment "shp_1"; linking it to shipment "shp_2" too is a conflict (409)`},
		{"link across accounts", dataset(dsAccounts, "", strings.Replace(ship("shp_1", "ord_1"), "acct_a", "acct_b", 1), dsOrder), `$.shipments[0].order_id: order "ord_1" belongs to acct_a/test, not to acct_b/test: shipment "shp_1" cannot be linked across accounts or environments`},
		{"link across environments", dataset(dsAccounts, "", strings.NewReplacer("acct_a", "acct_b", `"test"`, `"live"`).Replace(ship("shp_1", "ord_1")), strings.Replace(dsOrder, "acct_a", "acct_b", 1)), `$.shipments[0].order_id: order "ord_1" belongs to acct_b/test, not to acct_b/live: shipment "shp_1" cannot be linked across accounts or environments`},
		{"link to no order", dataset(dsAccounts, "", ship("shp_1", "ord_9"), dsOrder), `$.shipments[0].order_id: no order "ord_9" in acct_a/test to link shipment "shp_1" to`},
		{"order_id empty", dataset(dsAccounts, "", ship("shp_1", ""), dsOrder), `$.shipments[0].order_id: required, and must not be empty`},
		{"a member twice", dataset(dsAccounts, strings.Replace(dsKey, `"scopes"`, `"revoked":true,"revoked":false,"scopes"`, 1), "", ""), `$.keys[0].revoked: duplicate member: "revoked" is given already`},
		{"a member twice in another case", dataset(dsAccounts, strings.Replace(dsKey, `"scopes"`, `"revoked":true,"Revoked":false,"scopes"`, 1), "", ""), `$.keys[0].Revoked: duplicate member: "revoked" is given already`},
		{"a member in another case", dataset(dsAccounts, strings.Replace(dsKey, `"scopes"`, `"Revoked":true,"scopes"`, 1), "", ""), `$.keys[0].Revoked: unknown field`},
		{"a top-level member twice", `{"accounts":[` + dsAccounts + `],"Accounts":[]}`, `$.Accounts: duplicate member: "accounts" is given already`},
		{"an event member twice", dataset(dsAccounts, "", strings.Replace(dsShipment, `"description":"In transit"`, `"description":"In transit","Description":"x"`, 1), ""), `$.shipments[0].events[0].Description: duplicate member: "description" is given already`},
		{"an order id of 256 bytes", dataset(dsAccounts, "", "", strings.Replace(dsOrder, `"ord_1"`, `"`+strings.Repeat("o", 256)+`"`, 1)), `$.orders[0].id: is 256 bytes long; at most 255`},
		{"a key of 70,000 characters", dataset(dsAccounts, `{"key":"`+strings.Repeat("k", 70000)+`","account":"acct_a","environment":"test","scopes":[]}`, "", ""), `$.keys[0].key: is 70000 bytes long; at most 255`},
		{"a reference with a line feed", dataset(dsAccounts, "", strings.Replace(dsShipment, `"S1"`, `"S\n1"`, 1), ""), `$.shipments[0].reference: holds a control character`},
		{"a tracking number with DEL", dataset(dsAccounts, "", strings.Replace(dsShipment, `"T1"`, `"T\u007f1"`, 1), ""), `$.shipments[0].tracking_number: holds a control character`},
		{"a parcel number with C1 control", dataset(dsAccounts, "", strings.Replace(dsShipment, `"tracking_number":"T1"`, `"tracking_number":"T1","parcel_tracking_numbers":["P\u00851"]`, 1), ""), `$.shipments[0].parcel_tracking_numbers[0]: holds a control character`},
		{"an account id of 300 bytes", dataset(`{"id":"`+strings.Repeat("a", 300)+`","environments":["test"]}`, "", "", ""), `$.accounts[0].id: is 300 bytes long; at most 255`},
		{"an event with timestamp and after", dataset(dsAccounts, "", strings.Replace(dsShipment, `"status":"in_transit"`, `"after":"90s","status":"in_transit"`, 1), ""), `$.shipments[0].events[0].after: an event has a timestamp or an after, not both`},
		{"an after that is a number", dataset(dsAccounts, "", strings.Replace(dsShipment, `"timestamp":"2026-11-01T00:00:00Z"`, `"after":90`, 1), ""), `$.shipments[0].events[0].after: must be a string holding a duration such as "90s", "2m30s" or "-72h"`},
		{"an after that is no duration", dataset(dsAccounts, "", strings.Replace(dsShipment, `"timestamp":"2026-11-01T00:00:00Z"`, `"after":"soon"`, 1), ""), `$.shipments[0].events[0].after: "soon" is not a duration such as "90s", "2m30s" or "-72h"`},
		{"an after past a duration's range", dataset(dsAccounts, "", strings.Replace(dsShipment, `"timestamp":"2026-11-01T00:00:00Z"`, `"after":"9999999999h"`, 1), ""), `$.shipments[0].events[0].after: "9999999999h" is not a duration such as "90s", "2m30s" or "-72h"`},
		{"an id that is not UTF-8", dataset(dsAccounts, "", "", strings.Replace(dsOrder, `"ord_1"`, "\"o\xfe\"", 1)), `$.orders[0].id: holds bytes that are not UTF-8`},
		{"two ids that are not UTF-8", dataset(dsAccounts, "", "", strings.Replace(dsOrder, `"ord_1"`, "\"o\xfe\"", 1)+","+strings.Replace(dsOrder, `"ord_1"`, "\"o\xff\"", 1)), `$.orders[0].id: holds bytes that are not UTF-8`},
		{"a reference not UTF-8 after an escape", dataset(dsAccounts, "", strings.Replace(dsShipment, `"S1"`, "\"S\\u00e91\xc3\"", 1), ""), `$.shipments[0].reference: holds bytes that are not UTF-8`},
		{"a member name that is not UTF-8", dataset(dsAccounts, strings.Replace(dsKey, `"scopes"`, "\"sc\xe9\"", 1), "", ""), `$.keys[0]: a member name holds bytes that are not UTF-8`},
		{"a payload string that is not UTF-8", dataset(dsAccounts, "", "", strings.Replace(dsOrder, `"created_at"`, "\"raw_marketplace_data\":{\"Lines\":[{\"sku\":\"\xed\xa0\x80\"}]},\"created_at\"", 1)), `$.orders[0].raw_marketplace_data.Lines[0].sku: holds bytes that are not UTF-8`},
		{"a payload name that is not UTF-8", dataset(dsAccounts, "", "", strings.Replace(dsOrder, `"created_at"`, "\"raw_marketplace_data\":[1,{\"\x80\":1}],\"created_at\"", 1)), `$.orders[0].raw_marketplace_data[1]: a member name holds bytes that are not UTF-8`},
		{"a payload with a bad number", dataset(dsAccounts, "", "", strings.Replace(dsOrder, `"created_at"`, `"raw_marketplace_data":{"qty":01},"created_at"`, 1)), `$: invalid JSON at line 1, column 287: invalid character '1' after object key:value pair`},
		{"a payload nested too deep", dataset(dsAccounts, "", "", strings.Replace(dsOrder, `"created_at"`, `"raw_marketplace_data":`+strings.Repeat("[", 10001)+strings.Repeat("]", 10001)+`,"created_at"`, 1)), `$: invalid JSON at line 1, column 10276: exceeded max depth`},
		{"zeros", "\x00\x00\x00", `$: invalid JSON at line 1, column 1: invalid character '\x00' looking for beginning of value`},
		{"a bad escape", dataset(dsAccounts, "", "", strings.Replace(dsOrder, `"R1"`, `"R\q"`, 1)), `$: invalid JSON at line 1, column 215: invalid character 'q' in string escape code`},
		{"a raw line feed in a string", "{\n\"accounts\": [{\"id\": \"a\nb\"}]}", `$: invalid JSON at line 2, column 23: invalid character '\n' in string literal`},
		{"a merchant reference with a tab", dataset(dsAccounts, "", "", strings.Replace(dsOrder, `"R1"`, `"R\t1"`, 1)), `$.orders[0].merchant_reference: holds a control character`},
	}
	// The raw marketplace payload is opaque: a member twice there is the marketplace's.
	opaque := strings.Replace(dsOrder, `"created_at"`, `"raw_marketplace_data":{"a":1,"A":2,"a":3},"created_at"`, 1)
	if _, err := loadBytes("ok.json", []byte(dataset(dsAccounts, "", "", opaque)), 0, testNow, slog.New(slog.DiscardHandler)); err != nil {
		t.Errorf("a payload with a member twice: %v, want it loaded", err)
	}
	// 255 bytes are allowed, and page: the longest id's cursor is accepted.
	longID := strings.Repeat("o", 255)
	long := dataset(dsAccounts, `{"key":"sk_test_a","account":"acct_a","environment":"test","scopes":["orders:read"]}`, "",
		strings.Replace(dsOrder, `"ord_1"`, `"`+longID+`"`, 1)+","+strings.Replace(dsOrder, `"ord_1"`, `"`+strings.Repeat("p", 255)+`"`, 1))
	e := newEnv(t, envOptions{data: []byte(long)})
	page := decodePage(t, e.get(t, "/v1/orders?limit=1", "sk_test_a"))
	if next := decodePage(t, e.get(t, "/v1/orders?limit=1&cursor="+*page.Pagination.NextCursor, "sk_test_a")); len(next.Data) != 1 || next.Data[0].ID != longID {
		t.Errorf("the second page of 255-byte ids = %+v, want %s", next, longID[:10])
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadBytes("bad.json", []byte(tt.data), 0, testNow, slog.New(slog.DiscardHandler))
			if want := "dataset bad.json: " + tt.want; err == nil || err.Error() != want {
				t.Errorf("loadDataset = %v\nwant %s", err, want)
			}
		})
	}
	// An after may be negative (before the start instant), but never places an event
	// outside the years 0000 to 9999.
	negative := dataset(dsAccounts, "", strings.Replace(dsShipment, `"timestamp":"2026-11-01T00:00:00Z"`, `"after":"-100h"`, 1), "")
	if _, err := loadBytes("ok.json", []byte(negative), 0, testNow, slog.New(slog.DiscardHandler)); err != nil {
		t.Errorf("an event 100 hours before the start: %v, want it loaded", err)
	}
	for _, tt := range []struct{ start, after string }{{"9999-12-31T23:00:00Z", "1h"}, {"0000-01-01T01:00:00Z", "-1h0m0.000000001s"}} {
		start, _ := parseTimestamp(tt.start)
		data := dataset(dsAccounts, "", strings.Replace(dsShipment, `"timestamp":"2026-11-01T00:00:00Z"`, `"after":"`+tt.after+`"`, 1), "")
		_, err := loadBytes("bad.json", []byte(data), 0, start, slog.New(slog.DiscardHandler))
		if want := fmt.Sprintf("dataset bad.json: $.shipments[0].events[0].after: %q places the event outside the years 0000 to 9999 (the start instant is %s)", tt.after, tt.start); err == nil || err.Error() != want {
			t.Errorf("after %s from %s: %v, want %s", tt.after, tt.start, err, want)
		}
	}
	// -seed-orders needs acct_sandbox/test.
	_, err := loadBytes("small.json", []byte(dataset(dsAccounts, "", "", "")), 5, testNow, slog.New(slog.DiscardHandler))
	if want := "-seed-orders: the dataset has no account acct_sandbox with environment test to seed"; err == nil || err.Error() != want {
		t.Errorf("seeding a dataset without acct_sandbox/test = %v, want %s", err, want)
	}
}

// TestDatasetStreams: a dataset is read as a stream, whatever -data names: a device of
// zeros is refused at its first byte, a file over 2 GiB by its size before a byte is read,
// and a stream that passes its limit when it does.
func TestDatasetStreams(t *testing.T) {
	t.Parallel()
	err := run(context.Background(), []string{"-addr", "127.0.0.1:0", "-data", "/dev/zero"}, func(string) string { return "" }, io.Discard, io.Discard, nil)
	if want := `dataset /dev/zero: $: invalid JSON at line 1, column 1: invalid character '\x00' looking for beginning of value`; err == nil || err.Error() != want {
		t.Errorf("-data /dev/zero: %v, want %s", err, want)
	}
	huge := t.TempDir() + "/huge.json"
	if err := os.WriteFile(huge, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(huge, maxDatasetBytes+1); err != nil { // sparse: nothing is written
		t.Fatal(err)
	}
	err = run(context.Background(), []string{"-addr", "127.0.0.1:0", "-data", huge}, func(string) string { return "" }, io.Discard, io.Discard, nil)
	if want := "dataset " + huge + ": $: the file is 2147483649 bytes: a dataset is at most 2147483648 bytes (2 GiB)"; err == nil || err.Error() != want {
		t.Errorf("-data of 2 GiB and a byte: %v, want %s", err, want)
	}
	endless := io.MultiReader(strings.NewReader(`{"accounts":[`), neverEnding(' '))
	if _, err := readDatasetFile(endless, 1<<20); err == nil || err.Error() != "dataset : $: passes 1048576 bytes (1 MiB): a dataset is at most that" {
		t.Errorf("an endless stream read with a limit of 1 MiB: %v", err)
	}
	exact := `{"accounts":[]}`
	if _, err := readDatasetFile(strings.NewReader(exact), int64(len(exact))); err != nil {
		t.Errorf("a dataset of exactly the limit: %v, want it read", err)
	}
}

// manyAccounts is a dataset of n accounts, each with an order and a shipment, the
// shipment created with the order when linked.
func manyAccounts(n int, linked bool) []byte {
	var accounts, shipments, orders []string
	for i := range n {
		a := fmt.Sprintf("acct_%d", i)
		link := ""
		if linked {
			link = `,"order_id":"ord_` + a + `"`
		}
		accounts = append(accounts, `{"id":"`+a+`","environments":["test"]}`)
		orders = append(orders, `{"id":"ord_`+a+`","account":"`+a+`","environment":"test","merchant_reference":"R","platform":"ebay","status":"fulfilled","created_at":"2026-11-01T00:00:00Z"}`)
		shipments = append(shipments, `{"id":"shp_`+a+`","account":"`+a+`","environment":"test","reference":"S"`+link+`}`)
	}
	return []byte(dataset(strings.Join(accounts, ","), "", strings.Join(shipments, ","), strings.Join(orders, ",")))
}

// fastestLoad is the least CPU time of five loads of a dataset, with the collector off:
// what tests that compare loading times compare. Not the wall clock's time: on a machine
// whose every core is busy, a short load fits in the time it is given and a long one waits
// its turns, which the wall clock would count as the load's own.
func fastestLoad(t *testing.T, data []byte) time.Duration {
	t.Helper()
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	cpu := func() time.Duration { // the process's: with the collector off, the loading thread's and little else
		var u syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
			t.Fatal(err)
		}
		return time.Duration(u.Utime.Nano() + u.Stime.Nano())
	}
	best := time.Hour
	for range 5 {
		start := cpu()
		if _, err := loadBytes("timed.json", data, 0, testNow, slog.New(slog.DiscardHandler)); err != nil {
			t.Fatal(err)
		}
		best = min(best, cpu()-start)
	}
	return best
}

// newFIFO is a named pipe in the test's own folder, as a -data file nobody has written yet.
func newFIFO(t *testing.T) string {
	t.Helper()
	fifo := t.TempDir() + "/data.json"
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	return fifo
}

// TestLinkedAccountsLoadInLinearTime: linking a shipment to its order asks no other
// tenant, so many linked accounts load about as fast as unlinked ones (asking every tenant
// made 10,000 take 20 s and more, some 50 times the unlinked load at 5,000). The least CPU
// time of five loads of each is compared, and only a ratio that wide fails: a busy machine
// slows either load by a share, not by ten times.
func TestLinkedAccountsLoadInLinearTime(t *testing.T) { // not parallel: it compares two timings
	const n = 5000
	unlinked, linked := fastestLoad(t, manyAccounts(n, false)), fastestLoad(t, manyAccounts(n, true))
	if linked > 10*unlinked {
		t.Errorf("%d linked accounts load in %v, unlinked in %v: want about the same, at most ten times", n, linked, unlinked)
	}
}

// orderWithChanges is a dataset of one order whose status changes n times, a second apart.
func orderWithChanges(n int) []byte {
	var changes strings.Builder
	for i := range n {
		if i > 0 {
			changes.WriteByte(',')
		}
		fmt.Fprintf(&changes, `{"status":%q,"at":"start+%ds"}`, []string{"unfulfilled", "fulfilled"}[i%2], i+1)
	}
	return []byte(dataset(dsAccounts, "", "", strings.Replace(dsOrder, `"created_at":"2026-11-01T00:00:00Z"`, `"created_at":"start","changes":[`+changes.String()+`]`, 1)))
}

// TestOneOrdersChangesLoadInLinearTime: an order's states are made walking its changes
// once (a search of them for each state made 80,000 changes take 6.7 s). Sixteen times the
// changes load within 64 times the time: linear is sixteen times, the quadratic way 256, and
// a busy machine moves neither by four.
func TestOneOrdersChangesLoadInLinearTime(t *testing.T) { // not parallel: it compares two timings
	few, many := fastestLoad(t, orderWithChanges(2500)), fastestLoad(t, orderWithChanges(40000))
	if many > 64*few {
		t.Errorf("40,000 changes of one order load in %v, 2,500 in %v: want at most 64 times", many, few)
	}
}

// TestLoadWithoutLoss drives the handler chain from 16 goroutines with 20,000 mixed
// requests and checks every answer; unknown keys leave no state behind.
func TestLoadWithoutLoss(t *testing.T) {
	t.Parallel()
	// The limiter runs on every keyed request, on a clock that stands still, with room for
	// all of them: the answers do not depend on how the goroutines interleave.
	e := newEnv(t, envOptions{seed: 200, rate: maxRate, step: -1})
	type expect struct {
		target, key string
		status      int
		code        string
		body        string
	}
	mix := []expect{
		{"/v1/orders/ord_sbx_0001", "sk_test_sandbox_all", 200, "", sandboxOrderJSON},
		{"/v1/orders/ord_sbx_0001", "sk_test_sandbox_orders", 200, "", sandboxOrderJSON},
		{"/v1/orders/ord_other_0001", "sk_test_other_all", 200, "", otherOrderJSON},
		{"/v1/orders/ord_other_0001", "sk_test_sandbox_all", 404, "not_found", ""},
		{"/v1/orders?limit=3&status=cancelled", "sk_test_sandbox_all", 200, "", ""},
		{"/v1/orders?limit=0", "sk_test_sandbox_all", 422, "invalid_parameter", ""},
		{"/v1/orders?cursor=x", "sk_test_sandbox_orders", 400, "invalid_cursor", ""},
		{"/v1/shipments/shp_sbx_spring/tracking", "sk_test_sandbox_tracking", 200, "", ""},
		{"/v1/shipments/shp_sbx_spring/tracking", "sk_test_sandbox_orders", 403, "insufficient_scope", ""},
		{"/v1/tracking/SBX1000000001", "sk_test_other_all", 200, "", ""},
		{"/v1/tracking/SBX2000000000", "sk_test_sandbox_all", 404, "not_found", ""},
		{"/v1/orders", "sk_test_sandbox_none", 403, "insufficient_scope", ""},
		{"/v1/orders", "sk_test_sandbox_expired", 401, "expired_api_key", ""},
		{"/v1/orders", "sk_test_sandbox_revoked", 401, "revoked_api_key", ""},
		{"/v1/orders", "sk_live_sandbox_all", 503, "live_not_released", ""},
		{"/v1/orders", "", 401, "missing_api_key", ""},
		{"/v1/nope", "sk_test_sandbox_all", 404, "route_not_found", ""},
		{"/healthz", "", 200, "", `{"status":"ok"}`},
	}
	first := map[string][]byte{}
	for _, m := range mix {
		first[m.target+m.key] = e.get(t, m.target, m.key).body
	}
	const workers, total = 16, 20000
	var next atomic.Int64
	var failures atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= total {
					return
				}
				var m expect
				if i%5 == 4 { // an unknown key, never the same twice
					m = expect{"/v1/orders", "sk_test_unknown_" + strconv.FormatInt(i, 10), 401, "invalid_api_key", ""}
				} else {
					m = mix[int(i)%len(mix)]
				}
				rec := httptest.NewRecorder()
				e.h.ServeHTTP(rec, newRequest(http.MethodGet, m.target, m.key))
				ok := rec.Code == m.status
				if m.code != "" {
					ok = ok && strings.Contains(rec.Body.String(), `"code":"`+m.code+`"`) && rec.Header().Get("Content-Type") == "application/problem+json"
				} else if want := first[m.target+m.key]; ok && !strings.HasPrefix(m.key, "sk_test_unknown_") {
					ok = bytes.Equal(rec.Body.Bytes(), want)
				}
				if m.body != "" {
					ok = ok && rec.Body.String() == m.body
				}
				if !ok || !requestIDPattern.MatchString(rec.Header().Get("Request-Id")) {
					if failures.Add(1) <= 5 {
						t.Errorf("request %d: GET %s (%s) = %d %s, want %d %s", i, m.target, m.key, rec.Code, rec.Body, m.status, m.code)
					}
				}
			}
		}()
	}
	wg.Wait()
	if n := failures.Load(); n > 0 {
		t.Fatalf("%d of %d answers were wrong", n, total)
	}
	if lines := strings.Count(e.logs.String(), `"msg":"request"`); lines != total+len(mix) {
		t.Errorf("%d request log lines for %d requests", lines, total+len(mix))
	}
}

// shutdownRig serves h with serve and grace on loopback, and sends it request on a
// connection of its own: the request's body is streaming when the rig returns, once the
// handler has it. cancel starts the shutdown; serve's error arrives on stopped.
type shutdownRig struct {
	addr    string
	conn    net.Conn
	cancel  func()
	stopped chan error
}

func startShutdownRig(t *testing.T, h http.Handler, grace time.Duration, request string) *shutdownRig {
	t.Helper()
	arrived := make(chan struct{})
	signalled := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		h.ServeHTTP(w, r)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rig := &shutdownRig{addr: ln.Addr().String(), cancel: cancel, stopped: make(chan error, 1)}
	go func() {
		rig.stopped <- serve(ctx, newHTTPServer(defaultConfig(), signalled, slog.New(slog.DiscardHandler)), ln, func() {}, watchStop(ctx), grace)
	}()
	if rig.conn, err = net.Dial("tcp", rig.addr); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rig.conn.Close() })
	rig.conn.SetDeadline(time.Now().Add(20 * time.Second))
	io.WriteString(rig.conn, request)
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the request never reached the handler")
	}
	return rig
}

// TestGracefulShutdown: shutdown begins while a request's body is still streaming; new
// connections are refused, the request is answered in full, and serve returns nil.
func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	rig := startShutdownRig(t, e.h, 10*time.Second,
		"GET /v1/orders/ord_sbx_0001 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk_test_sandbox_all\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
	conn, stopped := rig.conn, rig.stopped
	rig.cancel()
	waitFor(t, "new connections to be refused", func() bool {
		c, err := net.DialTimeout("tcp", rig.addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	select {
	case err := <-stopped:
		t.Fatalf("serve returned %v while a request was in flight", err)
	default:
	}
	io.WriteString(conn, "5\r\nworld\r\n0\r\n\r\n")
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("the in-flight request was not answered: %v", err)
	}
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != 200 || string(body) != sandboxOrderJSON {
		t.Errorf("the in-flight request = %d %s, want 200 and the order", res.StatusCode, body)
	}
	select {
	case err := <-stopped:
		if err != nil {
			t.Errorf("serve = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("serve did not return after the last request finished")
	}
}

// TestSignalDrainsAndSaysSo: SIGTERM prints a line when shutting down and one when
// stopped, with the requests drained, and exits 0.
func TestSignalDrainsAndSaysSo(t *testing.T) {
	t.Parallel()
	cmd, stdout := startProcess(t, io.Discard)
	waitFor(t, "the banner", func() bool { return strings.Contains(stdout.String(), "Base URL: ") })
	base := regexp.MustCompile(`Base URL: (\S+)`).FindStringSubmatch(stdout.String())[1]
	u, _ := url.Parse(base)
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "GET /v1/orders/ord_sbx_0001 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk_test_sandbox_all\r\nPrefer: delay=1000\r\n\r\n")
	time.Sleep(300 * time.Millisecond) // no hook reaches into another process: the request has arrived by now
	start := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("the request in flight at the signal = %v, %v; want 200", res, err)
	}
	took, status := waitExit(t, cmd, start, 15*time.Second)
	out := stdout.String()
	if status != 0 || !strings.Contains(out, "Shutting down: requests in flight may take up to 10s to finish.") || !strings.Contains(out, "Stopped: 1 requests drained.") {
		t.Errorf("exit status %d after %v, stdout:\n%s\nwant 0, and the shutting-down and stopped lines with 1 request", status, took, out)
	}
}

// TestLogBufferCloseIsBounded: closing a log whose destination is stuck gives up after its
// bound and says lines were lost.
func TestLogBufferCloseIsBounded(t *testing.T) {
	t.Parallel()
	sink := &gatedSink{gate: make(chan struct{})}
	defer close(sink.gate)
	l := newLogBuffer(sink, time.Millisecond)
	l.Write([]byte("a line\n"))
	waitFor(t, "the flusher to be stuck in the destination", func() bool { return sink.waiting.Load() == 1 })
	l.Write([]byte("another line\n"))
	start := time.Now()
	err := l.closeWithin(100 * time.Millisecond)
	if took := time.Since(start); err == nil || took > time.Second {
		t.Errorf("closeWithin on a stuck destination = %v after %v, want an error after about 100ms", err, took)
	}
}

// TestShutdownGraceRunsOut: a request still in flight when the grace period ends is cut
// off, and serve says so rather than report a clean drain.
func TestShutdownGraceRunsOut(t *testing.T) {
	t.Parallel()
	reading := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.Copy(io.Discard, r.Body) })
	// A body that never ends keeps the request in flight.
	rig := startShutdownRig(t, reading, 100*time.Millisecond, "GET /v1/orders HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n")
	conn := rig.conn
	rig.cancel()
	select {
	case err := <-rig.stopped:
		if err == nil || !strings.Contains(err.Error(), "cut off") {
			t.Errorf("serve = %v, want an error saying requests were cut off", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("serve did not return after its grace period")
	}
	conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err == nil {
		t.Error("the cut-off connection is still open")
	}
}

// TestRunBoundsHeapGrowth: with a large dataset and main's heap tuner, run lets the heap
// grow by a bounded amount past it rather than double it; a GOGC variable, when set, wins;
// the setting is restored when run returns; without a tuner run leaves it alone, so that
// tests may call run in parallel.
func TestRunBoundsHeapGrowth(t *testing.T) { // not parallel: the GC setting is the process's
	current := func() int {
		sample := []metrics.Sample{{Name: "/gc/gogc:percent"}}
		metrics.Read(sample)
		return int(sample[0].Value.Uint64())
	}
	before := current()
	_, _, _, stop := startRunWithEnv(t, nil, boundHeapGrowth, "-seed-orders", "300000")
	during := current()
	// What is live grows while it serves (journals fill): the percentage follows it after
	// each collection, so that garbage grows by the headroom, not by a share of the dataset's
	// heap taken at the start; and back when it shrinks.
	grown := make([]byte, 256<<20)
	runtime.GC()
	waitFor(t, "the GC percentage to follow a live heap grown by 256 MiB", func() bool { return current() == gcPercent(liveHeap()) && current() < during/2 })
	runtime.KeepAlive(grown)
	runtime.GC()
	waitFor(t, "the GC percentage to follow the live heap back", func() bool { return current() == gcPercent(liveHeap()) && current() >= during*9/10 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if during < 10 || during >= 100 {
		t.Errorf("GC percentage %d while serving 300,000 orders, want 10 to 99", during)
	}
	if after := current(); after != before {
		t.Errorf("GC percentage %d after run returned, want %d as before", after, before)
	}
	_, _, _, stop = startRunWithEnv(t, map[string]string{"GOGC": "100"}, boundHeapGrowth, "-seed-orders", "300000")
	during = current()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if during != before {
		t.Errorf("GC percentage %d with GOGC set, want %d: the variable wins", during, before)
	}
	_, _, _, stop = startRun(t, "-seed-orders", "300000")
	during = current()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if during != before {
		t.Errorf("GC percentage %d from run without a tuner, want %d", during, before)
	}
}

// TestGCPercent: the heap grows by about 64 MiB past the dataset between collections, a
// small one as a large one; never by less than 10%.
func TestGCPercent(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		live uint64
		want int
	}{
		{0, 1600}, {1 << 20, 1600}, {4 << 20, 1600}, {16 << 20, 400}, {64 << 20, 100}, {128 << 20, 50}, {550 << 20, 11}, {640 << 20, 10}, {5 << 30, 10},
	} {
		if got := gcPercent(c.live); got != c.want {
			t.Errorf("gcPercent(%d MiB) = %d, want %d", c.live>>20, got, c.want)
		}
	}
}

// TestUnknownKeysLeaveNoState: unknown keys create no rate-limit state: 50,000 of them leave
// the heap where it was.
func TestUnknownKeysLeaveNoState(t *testing.T) { // not parallel: it measures the heap
	quiet := newEnv(t, envOptions{quiet: true}) // a kept log would grow by a line a request
	grown := heapGrowth(t, quiet.h, 50000, http.StatusUnauthorized, func(i int) *http.Request {
		return newRequest(http.MethodGet, "/v1/orders", "sk_test_flood_"+strconv.Itoa(i))
	})
	if grown > 1<<20 {
		t.Errorf("the heap grew by %d bytes over 50,000 unknown keys: they leave state behind", grown)
	}
	if rep := quiet.get(t, "/v1/orders", "sk_test_sandbox_all"); rep.status != 200 {
		t.Errorf("after the flood, GET with a known key = %s, want 200", rep)
	}
}

func FuzzLoadDataset(f *testing.F) {
	example, _ := os.ReadFile("testdata/example.json")
	for _, d := range []string{string(defaultDataset), string(example), dataset(dsAccounts, dsKey, dsShipment, dsOrder), `{`,
		`{"accounts":[{"id":"a","environments":["test"]}],"keys":[null],"orders":[{}]}`,
		dataset(dsAccounts, strings.Replace(dsKey, `"scopes"`, `"revoked":true,"Revoked":false,"scopes"`, 1), "", ""),
		dataset(dsAccounts, "", "", strings.Replace(dsOrder, `"ord_1"`, `"ord_\u0000"`, 1)),
		dataset(dsAccounts, "", "", strings.Replace(dsOrder, `"ord_1"`, `"`+strings.Repeat("o", 256)+`"`, 1)),
		dataset(dsAccounts, "", strings.Replace(dsShipment, `"reference":"S1"`, `"reference":"S1","order_id":""`, 1), dsOrder),
		`{"accounts":[{"id":"a","environments":["test"],"ID":"b"}]}`,
		movingDataset(12, 3),
		dataset(dsAccounts, "", `{"id":"shp_1","account":"acct_a","environment":"test","reference":"S","order_id":"ord_1","created_at":"start+1m"}`,
			strings.Replace(dsOrder, `"created_at":"2026-11-01T00:00:00Z"`, `"created_at":"start-1h","imported_at":"start","changes":[{"status":"cancelled","at":"start+2m"}]`, 1)),
	} {
		f.Add([]byte(d))
	}
	f.Add([]byte(dataset(dsAccounts, "", "", strings.Replace(dsOrder, `"created_at"`, "\"raw_marketplace_data\":{\"a\\ud800\":[\"\xfe\",-0.5e+3]},\"created_at\"", 1))))
	f.Fuzz(func(t *testing.T, data []byte) {
		sb, err := loadBytes("fuzz.json", data, 0, testNow, slog.New(slog.DiscardHandler))
		if err != nil {
			if !strings.HasPrefix(err.Error(), "dataset fuzz.json: $") {
				t.Fatalf("refusal %q does not name the file and a JSON path", err)
			}
			// The reader judges JSON as encoding/json does, and UTF-8 besides.
			if strings.Contains(err.Error(), ": invalid JSON at ") && json.Valid(data) {
				t.Fatalf("refused as invalid JSON (%v), which encoding/json reads", err)
			}
			return
		}
		if !json.Valid(data) || !utf8.Valid(data) {
			t.Fatalf("loaded a dataset that is not JSON or not UTF-8: %q", data)
		}
		for id, tenant := range sb.tenants.byID {
			tn := tenant.current()
			for _, s := range []string{id.account, id.environment} {
				if checkID("$", "", s) != nil {
					t.Fatalf("tenant %q loaded", id)
				}
			}
			for i := range tn.orders.count() {
				var o struct {
					MerchantReference string `json:"merchant_reference"`
				}
				mustDecode(t, tn.orders.resource(i), &o)
				if checkID("$", "", string(tn.orders.idOf(i))) != nil || checkID("$", "", o.MerchantReference) != nil {
					t.Fatalf("order %q (reference %q) loaded", tn.orders.idOf(i), o.MerchantReference)
				}
			}
			for sid, place := range tn.shipments.byID {
				sh := tn.shipments.list[place]
				if checkID("$", "", sid) != nil || !json.Valid(sh.full) || !json.Valid(sh.joinedView(0)) {
					t.Fatalf("shipment %q loaded as %s", sid, sh.full)
				}
			}
			for number := range tn.shipments.byTrackingNumber {
				if checkID("$", "", number) != nil {
					t.Fatalf("tracking number %q loaded", number)
				}
			}
			checkOrderIndex(t, &tn.orders)
		}
	})
}

// BenchmarkLoadAccounts: loading 20,000 accounts, each with an order and a shipment,
// linked or not.
func BenchmarkLoadAccounts(b *testing.B) {
	for _, linked := range []bool{false, true} {
		data := manyAccounts(20000, linked)
		b.Run(fmt.Sprintf("linked=%v", linked), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := loadBytes("many.json", data, 0, testNow, slog.New(slog.DiscardHandler)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// ===== main.go, serve: the server and its route table, every request, the checks in their order, the body, writing an answer, the access log =====

// main.go, the server: routes and paths, real sockets and connection limits, the body cap,
// the order of the checks, panics, the access log.

func TestRoutesMethodsAndPaths(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	tests := []struct {
		method, target string
		status         int
		code           string
	}{
		{"GET", "/index.html", 404, "route_not_found"},
		{"POST", "/", 405, "method_not_allowed"},
		{"GET", "/v1", 404, "route_not_found"},
		{"GET", "/v1/", 404, "route_not_found"},
		{"GET", "/v2/orders", 404, "route_not_found"},
		{"GET", "/v1/orders/", 404, "route_not_found"},
		{"GET", "/v1/shipments/shp_sbx_spring", 404, "route_not_found"},
		{"GET", "/v1/shipments//tracking", 404, "route_not_found"},
		{"GET", "/v1/tracking/", 404, "route_not_found"},
		{"GET", "/V1/orders", 404, "route_not_found"},
		{"GET", "//v1/orders", 404, "route_not_found"},
		{"GET", "/v1//orders", 404, "route_not_found"},
		{"GET", "/v1/./orders", 404, "route_not_found"},
		{"GET", "/v1/x/../orders", 404, "route_not_found"},
		{"GET", "/v1/orders/.", 404, "route_not_found"},
		// Escaped dots are dot segments (RFC 3986, 6.2.2.2): never an id.
		{"GET", "/v1/orders/%2E%2E", 404, "route_not_found"},
		{"GET", "/v1/shipments/%2e%2e/tracking", 404, "route_not_found"},
		{"GET", "/v1/tracking/.%2e", 404, "route_not_found"},
		{"GET", "/v1/%2e/orders", 404, "route_not_found"},
		{"POST", "/v1/nope", 404, "route_not_found"},
		{"POST", "/v1/orders", 405, "method_not_allowed"},
		{"PUT", "/v1/orders/ord_sbx_0001", 405, "method_not_allowed"},
		{"DELETE", "/v1/orders/ord_sbx_0001", 405, "method_not_allowed"},
		{"PATCH", "/v1/shipments/shp_sbx_spring/tracking", 405, "method_not_allowed"},
		{"OPTIONS", "/v1/tracking/SBX1000000001", 405, "method_not_allowed"},
		{"POST", "/healthz", 405, "method_not_allowed"},
		{"TRACE", "/v1/openapi.json", 405, "method_not_allowed"},
		{"GET", "/v1/orders/ord%2Fsbx", 404, "not_found"},
		{"GET", "/v1/orders/ord_sbx_0001%2F", 404, "not_found"},
		{"GET", "/v1/orders/ord_sbx_0001%2F..%2Ford_other_0001", 404, "not_found"},
		{"GET", "/v1/tracking/SBX1000000001%2F", 404, "not_found"},
		{"GET", "/v1/orders/sk_test_sandbox_all", 404, "not_found"},
		{"GET", "/v1/orders/" + strings.Repeat("x", 100<<10), 404, "not_found"},
		{"GET", "/v1/orders/%FF%FE", 404, "not_found"},
		{"GET", "/v1/shipments/shp%00/tracking", 404, "not_found"},
		{"GET", "/v1/sk_test_sandbox_all@orders", 404, "route_not_found"},
		{"GET", "/../v1/orders", 404, "route_not_found"},
		{"GET", "/v1\\orders", 404, "route_not_found"},
		{"GET", "/V1/ORDERS", 404, "route_not_found"},
		{"GET", "/v1/orders/ord_sbx_0001/shipment", 404, "route_not_found"},
		{"GET", "/v1/orders/ord_sbx_0001/", 404, "route_not_found"},
		{"BREW", "/v1/orders", 405, "method_not_allowed"},
		{"HEAD", "/v1/orders/ord_sbx_0001", 200, ""},
		{"GET", "/healthz", 200, ""},
		{"GET", "/v1/openapi.json", 200, ""},
	}
	for _, tt := range tests {
		t.Run(caseName(tt.method+" "+tt.target[:min(len(tt.target), 60)]), func(t *testing.T) {
			rep := e.do(t, newRequest(tt.method, tt.target, "sk_test_sandbox_all"))
			if tt.status == 200 {
				if rep.status != 200 {
					t.Fatalf("= %s, want 200", rep)
				}
				return
			}
			wantProblem(t, rep, tt.status, tt.code, "")
			if tt.status == 405 && rep.header.Get("Allow") != "GET, HEAD" {
				t.Errorf("Allow = %q, want GET, HEAD", rep.header.Get("Allow"))
			}
			if loc := rep.header.Get("Location"); loc != "" {
				t.Errorf("Location = %q: no path is redirected", loc)
			}
		})
	}
	// A 404 under /v1 never sends the client under /v1; outside it, it does. Both name the
	// document and the page.
	for target, under := range map[string]bool{"/v1/nope": true, "/v1/orders/ord_sbx_0001/x": true, "/v1/shipments/%2e%2e/tracking": true, "/v2/orders": false, "/orders": false, "//v1/orders": false} {
		detail := wantProblem(t, e.get(t, target, ""), 404, "route_not_found", "").Detail
		if strings.Contains(detail, "are under") == under || !strings.Contains(detail, "http://127.0.0.1:8080/v1/openapi.json") || !strings.Contains(detail, "http://127.0.0.1:8080/ shows") {
			t.Errorf("GET %s: the 404 says %q", target, detail)
		}
	}
	if rep := e.get(t, "/healthz", ""); string(rep.body) != `{"status":"ok"}` {
		t.Errorf("GET /healthz = %s, want {\"status\":\"ok\"}", rep)
	}
	// /v1 and /v1/ are no operation, whatever the method: their 404 sends a person to the
	// page and a client to the document, at the address the request used.
	for _, tt := range []struct{ method, target, host, origin string }{
		{"GET", "/v1", "127.0.0.1:8080", "http://127.0.0.1:8080"},
		{"POST", "/v1/", "localhost:9000", "http://localhost:9000"},
		{"DELETE", "/v1", "bad host", "http://127.0.0.1:8080"},
	} {
		r := newRequest(tt.method, tt.target, "")
		r.Host = tt.host
		p := wantProblem(t, e.do(t, r), 404, "route_not_found", "")
		if !strings.Contains(p.Detail, "open "+tt.origin+"/ for the keys") || !strings.Contains(p.Detail, tt.origin+"/v1/openapi.json") {
			t.Errorf("%s %s (Host %s): detail %q does not name %s/ and the document", tt.method, tt.target, tt.host, p.Detail, tt.origin)
		}
	}
}

// TestIsCleanPath: the guard agrees with ServeMux's own rule (path.Clean, keeping a
// trailing slash), so that the mux never gets a path it would redirect.
func TestIsCleanPath(t *testing.T) {
	t.Parallel()
	muxClean := func(p string) bool {
		if p == "" || p[0] != '/' {
			return false
		}
		np := path.Clean(p)
		if p[len(p)-1] == '/' && np != "/" {
			np += "/"
		}
		return np == p
	}
	// An escaped dot segment is a dot segment too.
	dots := func(p string) bool {
		for _, seg := range strings.Split(p, "/") {
			if u, err := url.PathUnescape(seg); err == nil && strings.Contains(seg, "%") && (u == "." || u == "..") {
				return true
			}
		}
		return false
	}
	segments := []string{"", ".", "..", "a", "v1", "...", ".a", "a.", "%2E", "%2e%2E", ".%2e", "%2e.", "%2e%2", "%41"}
	var paths []string
	var build func(prefix string, depth int)
	build = func(prefix string, depth int) {
		paths = append(paths, prefix)
		if depth == 4 {
			return
		}
		for _, s := range segments {
			build(prefix+"/"+s, depth+1)
		}
	}
	build("", 0)
	paths = append(paths, "a/b", "*", "/a//", "//")
	for _, p := range paths {
		if got, want := isCleanPath(p), muxClean(p) && !dots(p); got != want {
			t.Errorf("isCleanPath(%q) = %v, ServeMux's rule (with escaped dots unclean) says %v", p, got, want)
		}
	}
}

// TestServedOverTCP checks what only a real connection shows: HEAD sends no body, an
// unclean path is not redirected, OPTIONS * is the handler's, and a CONNECT gets JSON.
func TestServedOverTCP(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	ts := httptest.NewUnstartedServer(e.h)
	ts.Config = newHTTPServer(defaultConfig(), e.h, slog.New(slog.DiscardHandler))
	ts.Start()
	defer ts.Close()
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, _ := http.NewRequest(http.MethodHead, ts.URL+"/v1/orders/ord_sbx_0001", nil)
	req.Header.Set("Authorization", "Bearer sk_test_sandbox_all")
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || len(body) != 0 || res.Header.Get("Content-Length") != strconv.Itoa(len(sandboxOrderJSON)) {
		t.Errorf("HEAD = %d, body %q, Content-Length %s; want 200, no body, %d", res.StatusCode, body, res.Header.Get("Content-Length"), len(sandboxOrderJSON))
	}
	for _, raw := range []string{
		"GET //v1/orders HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /v1/./orders HTTP/1.1\r\nHost: x\r\n\r\n",
		"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
		"CONNECT 127.0.0.1:80 HTTP/1.1\r\nHost: x\r\n\r\n",
	} {
		conn, err := net.Dial("tcp", ts.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(conn, raw)
		res, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%q: %v", raw, err)
		}
		body, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
		conn.Close()
		if res.StatusCode != 404 || res.Header.Get("Content-Type") != "application/problem+json" || !bytes.Contains(body, []byte(`"code":"route_not_found"`)) {
			t.Errorf("%q = %d %s %s, want a 404 route_not_found problem", raw, res.StatusCode, res.Header.Get("Content-Type"), body)
		}
	}
}

// serveTCP serves h on loopback with the server's connection limits, cfg's where given.
func serveTCP(t *testing.T, h http.Handler, cfg config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := newHTTPServer(cfg, h, slog.New(slog.DiscardHandler))
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	return ln.Addr().String()
}

// readAll reads what conn sends until it closes or 5 s pass, and reports whether it closed.
func readAll(conn net.Conn) (string, bool) {
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(conn)
	return string(b), err == nil
}

// TestHalfClosedClientGetsNoEmptySuccess: a client that closes its side while a Prefer
// delay runs gets the whole answer or none, never a 200 with no body.
func TestHalfClosedClientGetsNoEmptySuccess(t *testing.T) {
	t.Parallel()
	addr := serveTCP(t, newEnv(t, envOptions{}).h, defaultConfig())
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "GET /v1/orders HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk_test_sandbox_all\r\nPrefer: delay=3000\r\n\r\n")
	conn.(*net.TCPConn).CloseWrite()
	got, closed := readAll(conn)
	if !closed || got != "" {
		t.Errorf("a half-closed client during a delay got %q (closed %v), want the connection closed with nothing", got, closed)
	}
}

// TestKeptAliveConnectionsCutPartialHeaders: after a first request, headers that arrive
// partly and then stall are cut off, as on a new connection: within 30 s by default.
func TestKeptAliveConnectionsCutPartialHeaders(t *testing.T) {
	t.Parallel()
	// Between two requests net/http waits under IdleTimeout for the next request's first
	// four bytes, then gives its headers ReadHeaderTimeout afresh: headers whose first byte
	// comes at once and the next three just before the idle deadline wait for both.
	if d := defaultConfig(); d.idleTimeout+d.readHeaderTimeout > 30*time.Second {
		t.Errorf("IdleTimeout %v and ReadHeaderTimeout %v: partial headers of a kept-alive connection would wait %v, past 30 s", d.idleTimeout, d.readHeaderTimeout, d.idleTimeout+d.readHeaderTimeout)
	}
	cfg := defaultConfig()
	cfg.idleTimeout, cfg.readHeaderTimeout = 600*time.Millisecond, 300*time.Millisecond
	bound := cfg.idleTimeout + cfg.readHeaderTimeout
	addr := serveTCP(t, newEnv(t, envOptions{}).h, cfg)
	for _, tt := range []struct {
		name  string
		first string        // sent at once after the first answer
		later string        // sent after a pause
		pause time.Duration // before later
	}{
		{"one byte", "G", "", 0},
		{"three bytes", "GET", "", 0},
		{"a byte, then three more just before the idle deadline", "G", "ET ", 550 * time.Millisecond},
		{"a request line, then a header just before the idle deadline", "GET /healthz HTTP/1.1\r\n", "Host: x\r\n", 550 * time.Millisecond},
	} {
		t.Run(tt.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
			br := bufio.NewReader(conn)
			res, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, res.Body)
			start := time.Now()
			io.WriteString(conn, tt.first)
			if tt.later != "" {
				time.Sleep(tt.pause)
				io.WriteString(conn, tt.later)
			}
			// Cut off: closed, after net/http's own 400 or nothing, or reset (data the server
			// did not read was still arriving). Only the read deadline means still open.
			conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err = io.Copy(io.Discard, br)
			var netErr net.Error
			if took := time.Since(start); errors.As(err, &netErr) && netErr.Timeout() || took > bound+300*time.Millisecond {
				t.Errorf("the connection was still open %v after the headers' first byte (%v); want it cut within %v", took, err, bound)
			}
		})
	}
}

// TestFramingOfItsOwnClosesTheConnection: a request with Transfer-Encoding (with or without
// a Content-Length beside it, which net/http drops before any handler) is answered, and
// the connection is then closed.
// TestBrokenChunkedFramingIsA400: a body whose chunked framing the client broke is
// answered 400 malformed_json where the connection still allows it, logged as such (not
// 499, as if the client had gone), and the connection is closed; nothing changes. A client
// that goes away in the middle of its body is still a 499.
func TestBrokenChunkedFramingIsA400(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1})
	addr := serveTCP(t, e.h, defaultConfig())
	send := func(t *testing.T, head, body string) (string, bool) {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		io.WriteString(conn, head+"Host: x\r\nAuthorization: Bearer sk_test_sandbox_all\r\nTransfer-Encoding: chunked\r\n\r\n"+body)
		return readAll(conn)
	}
	for _, framing := range []struct{ name, body string }{
		{"a size that is not hexadecimal", "zz\r\nhello\r\n0\r\n\r\n"},
		{"a negative size", "-1\r\nhello\r\n0\r\n\r\n"},
		{"a size of 18 digits", "000000000000000005\r\nhello\r\n0\r\n\r\n"},
		{"a size over 64 bits", "fffffffffffffffff\r\nhello\r\n0\r\n\r\n"},
		{"bare line feeds", "5\nhello\n0\n\n"},
		{"data longer than its size", "2\r\nhello\r\n0\r\n\r\n"},
	} {
		for _, head := range []string{"POST /v1/test_helpers/clock HTTP/1.1\r\n", "GET /v1/orders HTTP/1.1\r\n", "GET /healthz HTTP/1.1\r\n", "POST /v1/test_helpers/clock HTTP/1.1\r\nPrefer: delay=50\r\n"} {
			t.Run(framing.name+" "+strings.Fields(head)[1], func(t *testing.T) {
				got, closed := send(t, head, framing.body)
				status, rest, _ := strings.Cut(got, "\r\n")
				if status != "HTTP/1.1 400 Bad Request" || !closed || !strings.Contains(rest, "Content-Type: application/problem+json") ||
					!strings.Contains(rest, `"code":"malformed_json"`) || !strings.Contains(rest, "chunked framing is broken") {
					t.Errorf("%q answered %q (closed %v); want a 400 malformed_json, then the connection closed", framing.body, got, closed)
				}
			})
		}
	}
	if c := e.readClock(t, "sk_test_sandbox_all"); c.FrozenTime != "" {
		t.Errorf("the clock was set by a body whose framing was broken: %+v", c)
	}
	logs := e.logs.String()
	if strings.Contains(logs, `"status":499`) || strings.Count(logs, `"msg":"request body framing broken"`) != 24 {
		t.Errorf("the broken bodies are not logged as 400s, each with a warning:\n%s", logs)
	}
	// A client that goes away in the middle of a chunk is gone: nothing is sent.
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(conn, "POST /v1/test_helpers/clock HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk_test_sandbox_all\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n{\"froz")
	conn.(*net.TCPConn).CloseWrite()
	if got, _ := readAll(conn); got != "" {
		t.Errorf("a client gone in the middle of its body was answered %q", got)
	}
	conn.Close()
	waitFor(t, "the 499 of a client gone in the middle of its body", func() bool { return strings.Contains(e.logs.String(), `"status":499`) })
}

func TestFramingOfItsOwnClosesTheConnection(t *testing.T) {
	t.Parallel()
	addr := serveTCP(t, newEnv(t, envOptions{}).h, defaultConfig())
	for _, framing := range []string{"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n", "Transfer-Encoding: chunked\r\n"} {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n"+framing+"\r\n0\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		got, closed := readAll(conn)
		conn.Close()
		if !closed || strings.Count(got, "HTTP/1.1 200") != 1 || !strings.Contains(got, "Connection: close") {
			t.Errorf("%q: got %q (closed %v), want one 200 with Connection: close, then the connection closed", framing, got, closed)
		}
	}
}

func TestConnectionLimits(t *testing.T) {
	t.Parallel()
	cfg := defaultConfig()
	// A client that never finishes its headers is cut off after ReadHeaderTimeout.
	e := newEnv(t, envOptions{})
	cfg.readHeaderTimeout = 300 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := newHTTPServer(cfg, e.h, slog.New(slog.DiscardHandler))
	go srv.Serve(ln)
	defer srv.Close()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	io.WriteString(conn, "GET /v1/orders HTTP/1.1\r\nHost: x\r\nX-Slow: ")
	closed := make(chan time.Duration)
	go func() {
		io.Copy(io.Discard, conn)
		closed <- time.Since(start)
	}()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	giveUp := time.After(5 * time.Second)
	for {
		select {
		case took := <-closed:
			if took > 2*time.Second {
				t.Errorf("the slow client was cut off after %v, want about 300ms", took)
			}
			goto headers
		case <-tick.C:
			conn.Write([]byte("a")) // a byte at a time, never the end of the headers
		case <-giveUp:
			t.Fatal("a client that never finishes its headers is still connected after 5s")
		}
	}
headers:
	// Headers over MaxHeaderBytes are refused by net/http before any handler. The answer is
	// read while the request is still being written: net/http answers, half-closes and hangs
	// up 500 ms later, and a client whose write outlasts that (a busy machine) would see its
	// write fail rather than the answer, which is already there.
	big, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer big.Close()
	go fmt.Fprintf(big, "GET /healthz?%s HTTP/1.1\r\nHost: %s\r\n\r\n", strings.Repeat("a", 70<<10), ln.Addr())
	res, err := http.ReadResponse(bufio.NewReader(big), nil)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("70 KiB of request line = %d, want 431", res.StatusCode)
	}
}

func TestBodyLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	body := func(n int, declared bool, key string) *http.Request {
		var r *http.Request
		if declared {
			r = httptest.NewRequest(http.MethodGet, "http://127.0.0.1:8080/v1/orders", bytes.NewReader(make([]byte, n)))
		} else {
			r = httptest.NewRequest(http.MethodGet, "http://127.0.0.1:8080/v1/orders", chunkedBody{bytes.NewReader(make([]byte, n))})
			r.ContentLength = -1
		}
		if key != "" {
			r.Header.Set("Authorization", "Bearer "+key)
		}
		return r
	}
	// The routes without a key cap streamed bodies too.
	for _, target := range []string{"/healthz", "/v1/openapi.json", "/"} {
		r := httptest.NewRequest(http.MethodGet, "http://127.0.0.1:8080"+target, chunkedBody{io.LimitReader(neverEnding('z'), maxBodyBytes+1)})
		r.ContentLength = -1
		wantProblem(t, e.do(t, r), 413, "body_too_large", "")
	}
	for _, declared := range []bool{true, false} {
		if rep := e.do(t, body(maxBodyBytes, declared, "sk_test_sandbox_all")); rep.status != 200 {
			t.Errorf("a body of exactly 262144 bytes (declared %v) = %s, want 200", declared, rep)
		}
		wantProblem(t, e.do(t, body(maxBodyBytes+1, declared, "sk_test_sandbox_all")), 413, "body_too_large", "")
		// A declared length is refused before the key; a streamed body is read only
		// after the key and the checks that follow it.
		if declared {
			wantProblem(t, e.do(t, body(10<<20, declared, "")), 413, "body_too_large", "")
		} else {
			wantProblem(t, e.do(t, body(10<<20, declared, "")), 401, "missing_api_key", "")
		}
		if declared {
			huge := body(0, true, "sk_test_sandbox_all")
			huge.ContentLength = 1 << 40 // declared, nothing sent
			wantProblem(t, e.do(t, huge), 413, "body_too_large", "")
		}
		if rep := e.do(t, body(1, declared, "sk_test_sandbox_all")); rep.status != 200 {
			t.Errorf("a small body (declared %v) = %s, want 200: a GET's body is ignored", declared, rep)
		}
	}
	// Over a connection: a declared length over the cap is refused before the body is sent,
	// and a streamed body is refused once it passes the cap.
	ts := httptest.NewServer(e.h)
	defer ts.Close()
	for _, raw := range []string{
		"GET /v1/orders HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n",
		"GET /v1/orders HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk_test_sandbox_all\r\nTransfer-Encoding: chunked\r\n\r\n" + strings.Repeat("8000\r\n"+strings.Repeat("y", 0x8000)+"\r\n", 9),
	} {
		func() {
			conn, err := net.Dial("tcp", ts.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close() // also on failure, so that the server can close
			conn.SetDeadline(time.Now().Add(5 * time.Second))
			go io.WriteString(conn, raw)
			res, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Errorf("%.60q: %v", raw, err)
				return
			}
			b, _ := io.ReadAll(res.Body)
			if res.StatusCode != 413 || !bytes.Contains(b, []byte(`"code":"body_too_large"`)) {
				t.Errorf("%.60q = %d %s, want 413 body_too_large", raw, res.StatusCode, b)
			}
		}()
	}
}

// TestCheckOrder: when a request has several faults, the first check in the contract's
// order answers: route/method, body size, key, live, rate limit, scope, Prefer,
// parameters (422, then 400), resource.
func TestCheckOrder(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", maxBodyBytes+1)
	tests := []struct {
		name, method, target, key, body string
		headers                         []string
		status                          int
		code, param                     string
	}{
		{"unknown route before method", "POST", "/v1/nope", "", "", nil, 404, "route_not_found", ""},
		{"method before body size", "POST", "/v1/orders", "", big, nil, 405, "method_not_allowed", ""},
		{"body size before key", "GET", "/v1/orders", "", big, nil, 413, "body_too_large", ""},
		{"key before live", "GET", "/v1/orders?limit=0", "sk_live_nope", "", nil, 401, "invalid_api_key", ""},
		{"key before parameters", "GET", "/v1/orders?limit=0", "", "", nil, 401, "missing_api_key", ""},
		{"a key in the query is never read", "GET", "/v1/orders?api_key=sk_test_sandbox_all", "", "", nil, 401, "missing_api_key", ""},
		{"live before scope and parameters", "GET", "/v1/orders?limit=0", "sk_live_sandbox_all", "", []string{"Prefer", "code=500"}, 503, "live_not_released", ""},
		{"scope before Prefer", "GET", "/v1/orders", "sk_test_sandbox_tracking", "", []string{"Prefer", "code=500"}, 403, "insufficient_scope", ""},
		{"scope before parameters", "GET", "/v1/orders?limit=0", "sk_test_sandbox_none", "", nil, 403, "insufficient_scope", ""},
		{"Prefer before parameters", "GET", "/v1/orders?limit=0", "sk_test_sandbox_all", "", []string{"Prefer", "code=502"}, 502, "provider_not_confirmed", ""},
		{"bad Prefer before parameters", "GET", "/v1/orders?limit=0", "sk_test_sandbox_all", "", []string{"Prefer", "code=200"}, 422, "invalid_parameter", "Prefer"},
		{"422 before 400", "GET", "/v1/orders?cursor=garbage&limit=0", "sk_test_sandbox_all", "", nil, 422, "invalid_parameter", "limit"},
		{"parameters before resource", "GET", "/v1/orders/ord_nope?x=1", "sk_test_sandbox_all", "", nil, 422, "unknown_parameter", "x"},
		{"expired before scope", "GET", "/v1/orders", "sk_test_sandbox_expired", "", nil, 401, "expired_api_key", ""},
	}
	e := newEnv(t, envOptions{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRequest(tt.method, tt.target, tt.key, tt.headers...)
			if tt.body != "" {
				r = httptest.NewRequest(tt.method, "http://127.0.0.1:8080"+tt.target, strings.NewReader(tt.body))
				if tt.key != "" {
					r.Header.Set("Authorization", "Bearer "+tt.key)
				}
			}
			wantProblem(t, e.do(t, r), tt.status, tt.code, tt.param)
		})
	}
}

// TestPanicsBecomeInternalErrors: a panic in a handler is a 500 internal_error showing no
// internals; the stack is logged with the request id; the server keeps serving.
func TestPanicsBecomeInternalErrors(t *testing.T) {
	t.Parallel()
	panicking := route{"GET /v1/test/panic", func(w http.ResponseWriter, r *http.Request, c *call) {
		w.Header().Set("Content-Type", "text/plain")
		panic("boom: secret internals at /home/build/sandbox/orders.go:42")
	}}
	halfway := route{"GET /v1/test/panic-after-write", func(w http.ResponseWriter, r *http.Request, c *call) {
		w.Header().Set("Content-Length", "1000")
		w.WriteHeader(200)
		w.Write([]byte(`{"partial":`))
		panic("boom after writing")
	}}
	e := newEnv(t, envOptions{extra: []route{panicking, halfway}})
	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, newRequest(http.MethodGet, "/v1/test/panic", ""))
	rep := reply{status: rec.Code, header: rec.Result().Header, body: rec.Body.Bytes()}
	p := wantProblem(t, rep, 500, "internal_error", "")
	if strings.Contains(string(rep.body), "boom") || strings.Contains(string(rep.body), ".go") || rep.header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("the 500 shows internals: %s %s", rep.header.Get("Content-Type"), rep.body)
	}
	logs := e.logs.String()
	if !strings.Contains(logs, `"msg":"panic","request_id":"`+p.RequestID+`"`) || !strings.Contains(logs, "boom: secret internals") || !strings.Contains(logs, "goroutine") {
		t.Errorf("the panic is not logged with its request id and stack:\n%s", logs)
	}
	if rep := e.get(t, "/v1/orders/ord_sbx_0001", "sk_test_sandbox_all"); rep.status != 200 {
		t.Errorf("after a panic, GET = %s, want 200", rep)
	}

	// Over a connection: a panic after part of the answer is sent cuts the connection,
	// so that the client cannot take the part for a whole; the server keeps serving.
	ts := httptest.NewServer(e.h)
	defer ts.Close()
	res, err := http.Get(ts.URL + "/v1/test/panic-after-write")
	if err == nil {
		_, err = io.ReadAll(res.Body)
		res.Body.Close()
	}
	if err == nil {
		t.Error("a panic after a partial answer delivered it as complete")
	}
	res, err = http.Get(ts.URL + "/healthz")
	if err != nil || res.StatusCode != 200 {
		t.Errorf("after a panic, GET /healthz = %v, %v", res, err)
	}
}

// TestAccessLog: one structured line per request, with method, route, status, duration,
// request id and account.
func TestAccessLog(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	type line struct {
		Msg         string `json:"msg"`
		Level       string `json:"level"`
		Time        string `json:"time"`
		Method      string `json:"method"`
		Route       string `json:"route"`
		Status      int    `json:"status"`
		Duration    *int64 `json:"duration"`
		RequestID   string `json:"request_id"`
		Account     string `json:"account"`
		Environment string `json:"environment"`
	}
	requests := []struct {
		method, target, key string
		want                line
	}{
		{"GET", "/v1/orders", "sk_test_sandbox_all", line{Method: "GET", Route: "/v1/orders", Status: 200, Account: "acct_sandbox", Environment: "test"}},
		{"GET", "/v1/orders/ord_other_0001", "sk_test_other_all", line{Method: "GET", Route: "/v1/orders/{id}", Status: 200, Account: "acct_other", Environment: "test"}},
		{"GET", "/v1/shipments/x/tracking", "sk_test_sandbox_all", line{Method: "GET", Route: "/v1/shipments/{id}/tracking", Status: 404, Account: "acct_sandbox", Environment: "test"}},
		{"GET", "/v1/tracking/SBX9000000001", "sk_live_sandbox_all", line{Method: "GET", Route: "/v1/tracking/{tracking_number}", Status: 503, Account: "acct_sandbox", Environment: "live"}},
		{"GET", "/v1/orders", "sk_test_nope", line{Method: "GET", Route: "/v1/orders", Status: 401}},
		{"HEAD", "/v1/nope", "", line{Method: "HEAD", Route: "/v1/nope", Status: 404}},
		{"GET", "/.well-known/oauth-authorization-server/sk_test_sandbox_all/x%2Fy", "", line{Method: "GET", Route: "/.well-known/oauth-authorization-server/{key}/x%2Fy", Status: 404}},
		{"DELETE", "/v1/orders", "", line{Method: "DELETE", Route: "/v1/orders", Status: 405}},
		{"GET", "/healthz", "", line{Method: "GET", Route: "/healthz", Status: 200}},
	}
	var ids []string
	for _, r := range requests {
		ids = append(ids, e.do(t, newRequest(r.method, r.target, r.key)).header.Get("Request-Id"))
	}
	var lines []line
	sc := bufio.NewScanner(strings.NewReader(e.logs.String()))
	for sc.Scan() {
		var l line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("log line %q is not JSON: %v", sc.Text(), err)
		}
		if l.Msg == "request" {
			lines = append(lines, l)
		}
	}
	if len(lines) != len(requests) {
		t.Fatalf("%d request lines for %d requests:\n%s", len(lines), len(requests), e.logs)
	}
	for i, r := range requests {
		got := lines[i]
		if got.Duration == nil || *got.Duration < 0 || got.Level != "INFO" || got.Time == "" || got.RequestID != ids[i] {
			t.Errorf("line %d = %+v: want a duration, level INFO, a time and request id %s", i, got, ids[i])
		}
		got.Duration, got.Level, got.Time, got.RequestID, got.Msg = nil, "", "", "", ""
		if got != r.want {
			t.Errorf("%s %s logged %+v, want %+v", r.method, r.target, got, r.want)
		}
	}
}

// TestLogValuesAreBounded: a method a client sends over 256 bytes is logged as its first
// 253 bytes, cut at a UTF-8 boundary, and "...", so a 64 KiB method costs a normal line.
func TestLogValuesAreBounded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	e.do(t, newRequest(strings.Repeat("M", 64<<10), "/v1/orders", ""))
	logs := strings.TrimSpace(e.logs.String())
	var line struct{ Method string }
	if err := json.Unmarshal([]byte(logs[strings.LastIndexByte(logs, '\n')+1:]), &line); err != nil {
		t.Fatal(err)
	}
	if want := strings.Repeat("M", 253) + "..."; line.Method != want {
		t.Errorf("logged method of %d bytes, want the first 253 and ...", len(line.Method))
	}
	if len(logs) > 1024 {
		t.Errorf("the request's log line is %d bytes, want a normal line", len(logs))
	}
	for _, tt := range []struct{ in, want string }{
		{strings.Repeat("a", 256), strings.Repeat("a", 256)},
		{strings.Repeat("a", 257), strings.Repeat("a", 253) + "..."},
		{strings.Repeat("a", 252) + "é" + strings.Repeat("a", 10), strings.Repeat("a", 252) + "..."},
		{strings.Repeat("a", 251) + "日" + strings.Repeat("a", 10), strings.Repeat("a", 251) + "..."},
		{strings.Repeat("a", 250) + "日" + strings.Repeat("a", 10), strings.Repeat("a", 250) + "日..."},
	} {
		t.Run(fmt.Sprint(len(tt.in), " bytes, ", tt.in[250:]), func(t *testing.T) {
			if got := boundLogValue(tt.in); got != tt.want {
				t.Errorf("boundLogValue(%d bytes) = %q, want %q", len(tt.in), got, tt.want)
			}
		})
	}
}

// TestRequestLineIsWhatJSONHandlerWrites: the access log's line, written without a slog
// record, is byte for byte what slog's JSONHandler writes for the same record.
func TestRequestLineIsWhatJSONHandlerWrites(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 22, 4, 5, 6, 789000000, time.UTC)
	tests := []struct {
		name                     string
		method, route            string
		status                   int
		d                        time.Duration
		id, account, environment string
	}{
		{"an operation", "GET", "/v1/orders/{id}", 200, 1234567, "req_x", "acct_sandbox", "test"},
		{"no key, client gone", "DELETE", "", statusClientClosedRequest, 0, "req_y", "", ""},
		{"odd bytes", "G\"E\\T\x00", "/v1/\u2028<&>\xff", -1, -5, "", "é", "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := appendRequestLine(nil, at, tt.method, tt.route, tt.status, tt.d, tt.id, tt.account, tt.environment)
			var want bytes.Buffer
			r := slog.NewRecord(at, slog.LevelInfo, "request", 0)
			r.AddAttrs(slog.String("method", tt.method), slog.String("route", tt.route), slog.Int("status", tt.status),
				slog.Duration("duration", tt.d), slog.String("request_id", tt.id), slog.String("account", tt.account), slog.String("environment", tt.environment))
			if err := slog.NewJSONHandler(&want, nil).Handle(context.Background(), r); err != nil {
				t.Fatal(err)
			}
			if string(got) != want.String() {
				t.Errorf("appendRequestLine = %q\nJSONHandler writes %q", got, want.String())
			}
		})
	}
}

func TestRequestIDsAreUnique(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1})
	seen := map[string]bool{}
	for i := 0; i < 2000; i++ {
		id := e.get(t, "/healthz", "").header.Get("Request-Id")
		if seen[id] {
			t.Fatalf("request id %s repeats after %d requests", id, i)
		}
		seen[id] = true
	}
}

// TestSecretsAreNeverLogged: the log of a run that uses every key, on every operation and
// in every odd place, holds no key and no Authorization value.
func TestSecretsAreNeverLogged(t *testing.T) {
	t.Parallel()
	base, _, stderr, stop := startRun(t)
	keys := []string{"sk_test_sandbox_all", "sk_test_sandbox_tracking", "sk_test_sandbox_orders", "sk_test_sandbox_none", "sk_test_sandbox_expired", "sk_test_sandbox_revoked", "sk_test_other_all", "sk_live_sandbox_all", "sk_test_not_a_key"}
	for _, key := range keys {
		for _, target := range []string{"/shipments/shp_sbx_spring/tracking", "/tracking/SBX1000000001", "/orders?limit=1", "/orders/ord_sbx_0001", "/orders/" + key, "/orders?api_key=" + key, "/nope/" + key} {
			for _, auth := range []string{"Bearer " + key, "Basic " + key, key} {
				httpGet(t, base+target, auth, "Prefer", "code="+key)
			}
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	logs := stderr.String()
	if strings.Count(logs, `"msg":"request"`) != len(keys)*7*3 {
		t.Fatalf("the log has %d request lines, want %d: the test would prove nothing", strings.Count(logs, `"msg":"request"`), len(keys)*7*3)
	}
	for _, secret := range append(keys, "Bearer", "Basic", "Authorization", "sk_test", "sk_live") {
		if strings.Contains(logs, secret) {
			t.Errorf("the log holds %q", secret)
		}
	}
}

// TestLogBufferKeepsEveryLine: lines from many writers all arrive, whole and in each
// writer's order, whether flushed by the timer, by size or at Close.
func TestLogBufferKeepsEveryLine(t *testing.T) {
	t.Parallel()
	sink := openSink()
	l := newLogBuffer(sink, time.Millisecond)
	const writers, lines = 8, 3000
	var wg sync.WaitGroup
	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range lines {
				fmt.Fprintf(l, "{\"writer\":%d,\"n\":%d,\"pad\":%q}\n", g, n, strings.Repeat("x", n%50))
			}
		}()
	}
	wg.Wait()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	next := make([]int, writers)
	for i, line := range strings.Split(strings.TrimSuffix(sink.String(), "\n"), "\n") {
		var v struct{ Writer, N int }
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			t.Fatalf("line %d is not whole: %q", i, line)
		}
		if v.N != next[v.Writer] {
			t.Fatalf("writer %d: line %d arrived where %d was due", v.Writer, v.N, next[v.Writer])
		}
		next[v.Writer]++
	}
	for g, n := range next {
		if n != lines {
			t.Errorf("writer %d: %d lines arrived, want %d", g, n, lines)
		}
	}
	fmt.Fprintf(l, "after close\n")
	if !strings.HasSuffix(sink.String(), "\nafter close\n") {
		t.Error("a line written after Close did not go straight out")
	}
}

// TestLogBufferFlushes: lines go out on the timer, and at once when a batch is full,
// without waiting for Close.
func TestLogBufferFlushes(t *testing.T) {
	t.Parallel()
	sink := openSink()
	l := newLogBuffer(sink, 10*time.Millisecond)
	l.Write([]byte("one line\n"))
	waitFor(t, "the timer's flush", func() bool { return sink.String() == "one line\n" })
	l.Close()

	sink = openSink()
	l = newLogBuffer(sink, time.Hour)
	defer l.Close()
	batch := strings.Repeat("x", logFlushSize-1) + "\n"
	l.Write([]byte(batch))
	waitFor(t, "a full batch to go out", func() bool { return sink.String() == batch })
}

// TestLogBufferSlowSink: while the destination is stuck, requests still only append
// their lines (no request waits on the system call), up to logMaxBacklog; past it they
// wait for the destination rather than let the backlog grow. Nothing is lost.
func TestLogBufferSlowSink(t *testing.T) {
	t.Parallel()
	sink := &gatedSink{gate: make(chan struct{})}
	l := newLogBuffer(sink, time.Hour)
	line := []byte(strings.Repeat("y", 1023) + "\n")
	for range logFlushSize / len(line) {
		l.Write(line) // the last one hands a full batch to the flusher
	}
	waitFor(t, "the flusher to be stuck in the destination", func() bool { return sink.waiting.Load() == 1 })
	var wrote atomic.Int64
	written := make(chan struct{})
	go func() {
		defer close(written)
		for range logMaxBacklog / len(line) {
			l.Write(line)
			wrote.Add(1)
		}
	}()
	select {
	case <-written:
	case <-time.After(5 * time.Second):
		t.Fatalf("writers waited on a stuck destination after %d lines", wrote.Load())
	}
	over := make(chan struct{})
	go func() { l.Write(line); close(over) }()
	select {
	case <-over:
		t.Fatal("the backlog grew past logMaxBacklog")
	case <-time.After(50 * time.Millisecond):
	}
	close(sink.gate)
	<-over
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if want := (logFlushSize/len(line) + logMaxBacklog/len(line) + 1) * len(line); len(sink.String()) != want {
		t.Errorf("%d bytes arrived, want %d", len(sink.String()), want)
	}
}

// FuzzHandlerChain sends arbitrary methods, paths, queries, Authorization values and
// bodies through the whole chain: the answer is a 200 or a problem+json 4xx, never a 5xx.
func FuzzHandlerChain(f *testing.F) {
	e := newEnv(f, envOptions{seed: 20, rate: -1})
	seeds := [][4]string{
		{"GET", "/v1/orders", "limit=3", "Bearer sk_test_sandbox_all"},
		{"GET", "/v1/orders/ord_sbx_0001", "", "Bearer sk_test_sandbox_all"},
		{"HEAD", "/v1/shipments/shp_sbx_spring/tracking", "", "Bearer sk_test_sandbox_tracking"},
		{"GET", "/v1/tracking/SBX2000000000", "", "bearer sk_test_other_all"},
		{"POST", "/v1/orders", "status=x", "Basic x"},
		{"GET", "//v1/./orders/..", "cursor=%%", "Bearer "},
		{"GET", "/v1/orders", "created_from=2026-01-01T00:00:00+01:00&created_to=x", "Bearer sk_live_sandbox_all"},
		{"DELETE", "/healthz", "", ""},
		{"GET", "", "", ""},
		{"CONNECT", "/v1/orders", "", "Bearer sk_test_sandbox_all"},
		{"GET", "/v1/orders", "status=cancelled", "Bearer sk_test_sync_all"},
		{"GET", "/v1/tracking/SYNC1000000001", "", "Bearer sk_test_sync_all"},
	}
	for _, s := range seeds {
		f.Add(s[0], s[1], s[2], s[3], "")
	}
	f.Add("GET", "/v1/orders", "", "Bearer sk_test_sandbox_all", strings.Repeat("b", 300))
	f.Fuzz(func(t *testing.T, method, path, query, auth, body string) {
		u := &url.URL{Path: path, RawQuery: query}
		r := &http.Request{Method: method, URL: u, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: http.Header{}, Host: "x",
			RequestURI: u.RequestURI(), Body: io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body))}
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		rec := httptest.NewRecorder()
		e.h.ServeHTTP(rec, r)
		rep := reply{status: rec.Code, header: rec.Result().Header, body: rec.Body.Bytes()}
		// The one 5xx a client gets without asking (Prefer) is a live key's 503.
		live := rep.status == 503 && bytes.Contains(rep.body, []byte(`"code":"live_not_released"`))
		if rep.status != 200 && (rep.status < 400 || rep.status > 499) && !live {
			t.Fatalf("%q %q ? %q (Authorization %q) = %s", method, path, query, auth, rep)
		}
		if method == http.MethodGet || method == http.MethodHead {
			checkResponse(t, r, rep)
		} else if rep.status >= 400 {
			rep.problem(t)
		}
	})
}

// BenchmarkRejected: the error paths are cheap too.
func BenchmarkRejected(b *testing.B) {
	e := benchEnv(b, 0)
	limited := newEnv(b, envOptions{step: -1, quiet: true})
	for i := 0; i < 25; i++ {
		limited.get(b, "/v1/orders", "sk_test_sandbox_all")
	}
	cases := []struct {
		name   string
		h      http.Handler
		r      *http.Request
		status int
	}{
		{"401_unknown_key", e.h, newRequest("GET", "/v1/orders/ord_sbx_0001", "sk_test_nope"), 401},
		{"403_scope", e.h, newRequest("GET", "/v1/orders/ord_sbx_0001", "sk_test_sandbox_tracking"), 403},
		{"404_order", e.h, newRequest("GET", "/v1/orders/ord_nope", "sk_test_sandbox_all"), 404},
		{"404_route", e.h, newRequest("GET", "/v1/nope", ""), 404},
		{"429_rate_limited", limited.h, newRequest("GET", "/v1/orders/ord_sbx_0001", "sk_test_sandbox_all"), 429},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) { benchServe(b, c.h, c.r, c.status) })
	}
}

// ===== main.go, serve: Prefer, and faults (with auth.go's Rehearsals counted) =====

// main.go, Prefer: an answer the sandbox never gives on its own, a delay, and a request at
// its own instant.

func TestPreferSimulatedCodes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	tests := []struct {
		prefer     string
		status     int
		code       string
		retryAfter string
		applied    string
	}{
		{"code=429", 429, "rate_limited", "1", "code=429"},
		{"code=500", 500, "internal_error", "", "code=500"},
		{"code=502", 502, "provider_not_confirmed", "", "code=502"},
		{"code=503", 503, "provider_unavailable", "1", "code=503"},
		{"CODE=500", 500, "internal_error", "", "code=500"},
		{`code="502"`, 502, "provider_not_confirmed", "", "code=502"},
		{"respond-async; reason=test, code=503", 503, "provider_unavailable", "1", "code=503"}, // another preference's parameters are ignored
		{"respond-async, code=500, wait=10", 500, "internal_error", "", "code=500"},
		{"code=500, code=502", 500, "internal_error", "", "code=500"},
		{"code=503, delay=5", 503, "provider_unavailable", "1", "code=503, delay=5"},
		{"delay=00, code=502", 502, "provider_not_confirmed", "", "delay=0, code=502"},
	}
	for _, op := range operations {
		for _, tt := range tests {
			t.Run(caseName(op.name+" "+tt.prefer), func(t *testing.T) {
				rep := e.get(t, op.target, "sk_test_sandbox_all", "Prefer", tt.prefer)
				p := wantProblem(t, rep, tt.status, tt.code, "")
				if rep.header.Get("Retry-After") != tt.retryAfter || rep.header.Get("Preference-Applied") != tt.applied {
					t.Errorf("Retry-After %q, Preference-Applied %q; want %q, %q", rep.header.Get("Retry-After"), rep.header.Get("Preference-Applied"), tt.retryAfter, tt.applied)
				}
				if strings.Contains(string(rep.body), "ord_sbx") || strings.Contains(string(rep.body), "shp_sbx") || !strings.Contains(p.Detail, "Simulated") {
					t.Errorf("a simulated answer %s shows data or does not say it is simulated", rep.body)
				}
			})
		}
	}
	// Two Prefer fields are one list (RFC 7240): the first instance of code counts.
	rep := e.get(t, "/v1/orders", "sk_test_sandbox_all", "Prefer", "code=502", "Prefer", "code=500")
	wantProblem(t, rep, 502, "provider_not_confirmed", "")
}

// TestPreferReadsTheFirstPreferences: preferences past the sixteenth are not read, so that
// a header of thousands costs what a short one does.
func TestPreferReadsTheFirstPreferences(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	filler := strings.Repeat("x=1, ", 15)
	wantProblem(t, e.get(t, "/v1/orders", "sk_test_sandbox_all", "Prefer", filler+"code=500"), 500, "internal_error", "")
	if rep := e.get(t, "/v1/orders", "sk_test_sandbox_all", "Prefer", filler+"x=1, code=500"); rep.status != 200 || rep.header.Get("Preference-Applied") != "" {
		t.Errorf("code=500 as the 17th preference = %s (Preference-Applied %q), want it not read", rep, rep.header.Get("Preference-Applied"))
	}
	if rep := e.get(t, "/v1/orders", "sk_test_sandbox_all", "Prefer", strings.Repeat(",", 60000)+"code=500"); rep.status != 200 {
		t.Errorf("60,000 empty preferences, then code=500 = %s, want 200", rep)
	}
}

func TestPreferInvalidValues(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	for _, prefer := range []string{"code=404", "code=200", "code=abc", "code=", "code", "code=5000", "code=-500", "code=500.0",
		"delay=-1", "delay=10001", "delay=abc", "delay=1.5", "delay=", "delay", "delay=99999999999999999999", "delay=1e3", "code=500, delay=20000", "code=599", "delay=600000",
		"code=503; reason=test", `run="bad run"`, "run=", "run=" + strings.Repeat("r", 65)} {
		rep := e.get(t, "/v1/orders", "sk_test_sandbox_all", "Prefer", prefer)
		wantProblem(t, rep, 422, "invalid_parameter", "Prefer")
		if rep.header.Get("Preference-Applied") != "" {
			t.Errorf("Prefer %q: a refused preference is reported applied: %q", prefer, rep.header.Get("Preference-Applied"))
		}
	}
}

// TestPreferDoesNotOutrankRealAnswers: a live key, a missing or bad key, a key without the
// scope and a rate-limited key get exactly what they get without the header.
func TestPreferDoesNotOutrankRealAnswers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{step: -1})
	for _, key := range []string{"sk_live_sandbox_all", "", "sk_test_nope", "sk_test_sandbox_expired", "sk_test_sandbox_revoked", "sk_test_sandbox_tracking"} {
		plain := e.get(t, "/v1/orders", key)
		prefer := e.get(t, "/v1/orders", key, "Prefer", "code=500, delay=1")
		if plain.status == 200 || prefer.status != plain.status || withoutRequestID(t, prefer.body) != withoutRequestID(t, plain.body) || prefer.header.Get("Preference-Applied") != "" {
			t.Errorf("key %q: with Prefer %s, without %s", key, prefer, plain)
		}
	}
	for i := 0; i < 25; i++ {
		e.get(t, "/v1/orders", "sk_test_sandbox_all")
	}
	rep := e.get(t, "/v1/orders", "sk_test_sandbox_all", "Prefer", "code=500")
	if p := wantProblem(t, rep, 429, "rate_limited", ""); strings.Contains(p.Detail, "Simulated") || rep.header.Get("Preference-Applied") != "" {
		t.Errorf("a rate-limited key's Prefer was applied: %s", rep)
	}
}

// TestRequestsWithoutPreferAreUnchanged: without Prefer (or with only preferences the
// sandbox ignores) the answer is the same, byte for byte apart from the request id.
func TestRequestsWithoutPreferAreUnchanged(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	for _, target := range []string{"/v1/orders", "/v1/orders/ord_sbx_0001", "/v1/orders/nope", "/v1/orders?limit=0", "/v1/shipments/shp_sbx_spring/tracking", "/v1/tracking/SBX2000000000"} {
		plain := e.get(t, target, "sk_test_sandbox_all")
		ignored := e.get(t, target, "sk_test_sandbox_all", "Prefer", "return=minimal, respond-async, wait=5, handling=strict", "Prefer", `;;,,=="\x01`)
		if plain.header.Get("Preference-Applied") != "" || ignored.header.Get("Preference-Applied") != "" {
			t.Errorf("%s: Preference-Applied without an applied preference", target)
		}
		if plain.status != ignored.status || withoutRequestID(t, plain.body) != withoutRequestID(t, ignored.body) {
			t.Errorf("%s: %s, with ignored preferences %s", target, plain, ignored)
		}
		for _, h := range [][]string{plain.header.Values("Request-Id"), ignored.header.Values("Request-Id")} {
			if len(h) != 1 {
				t.Errorf("%s: Request-Id %v", target, h)
			}
		}
		a, b := plain.header.Clone(), ignored.header.Clone()
		a.Del("Request-Id")
		b.Del("Request-Id")
		if fmt.Sprint(a) != fmt.Sprint(b) {
			t.Errorf("%s: headers %v, with ignored preferences %v", target, a, b)
		}
	}
}

func TestPreferDelay(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	start := time.Now()
	rep := e.get(t, "/v1/orders/ord_sbx_0001", "sk_test_sandbox_all", "Prefer", "delay=30")
	if took := time.Since(start); took < 30*time.Millisecond || rep.status != 200 || string(rep.body) != sandboxOrderJSON || rep.header.Get("Preference-Applied") != "delay=30" {
		t.Errorf("delay=30 took %v and answered %s (Preference-Applied %q); want at least 30ms, the order, delay=30", took, rep, rep.header.Get("Preference-Applied"))
	}

	// A client that goes away ends the wait: nothing is sent, and the log says 499.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := newRequest(http.MethodGet, "/v1/orders", "sk_test_sandbox_all", "Prefer", "delay=10000").WithContext(ctx)
	rec := httptest.NewRecorder()
	start = time.Now()
	func() {
		defer func() {
			if v := recover(); v != http.ErrAbortHandler {
				t.Errorf("a request whose client is gone ended with %v, want the panic http.ErrAbortHandler (no answer at all)", v)
			}
		}()
		e.h.ServeHTTP(rec, r)
	}()
	if took := time.Since(start); took > 5*time.Second || rec.Body.Len() != 0 || rec.Code != 200 && rec.Code != 0 {
		t.Errorf("a request whose client is gone took %v and was answered %d %s; want at once, nothing", took, rec.Code, rec.Body)
	}
	if !strings.Contains(e.logs.String(), `"route":"/v1/orders","status":499`) {
		t.Errorf("the log does not record the gone client's request as 499:\n%s", e.logs)
	}

	// Shutting down ends the wait too: the request is answered at once.
	close(e.stopping)
	start = time.Now()
	shut := e.get(t, "/v1/orders", "sk_test_sandbox_all", "Prefer", "delay=10000, code=503")
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("a delay during shutdown took %v, want an answer at once", took)
	}
	wantProblem(t, shut, 503, "provider_unavailable", "")
	if got := shut.header.Get("Preference-Applied"); got != "code=503" {
		t.Errorf("a delay cut short by a shutdown: Preference-Applied %q, want code=503 (the delay was not applied)", got)
	}
	if got := e.get(t, "/v1/orders/ord_sbx_0001", "sk_test_sandbox_all", "Prefer", "delay=4000").header.Values("Preference-Applied"); len(got) != 0 {
		t.Errorf("a delay alone, cut short: Preference-Applied %q, want none", got)
	}
}

// TestPreferCodeTimes: code=503; times=2 fails the first two requests of a sequence (the
// tenant, method, target as sent and whole Prefer value), then answers as without the code,
// still applying delay and clock; a sequence is forgotten 60 s after its last request; a
// tenant holds at most 10,000, the least recently used forgotten first; requests that fail
// before the Prefer step are not counted.
func TestPreferCodeTimes(t *testing.T) {
	t.Parallel()
	const key = "sk_test_sandbox_all"
	answers := func(t *testing.T, e *env, n int, target, prefer string, key string) []string {
		t.Helper()
		var got []string
		for range n {
			rep := e.get(t, target, key, "Prefer", prefer)
			got = append(got, fmt.Sprintf("%d %s", rep.status, rep.header.Get("Preference-Applied")))
		}
		return got
	}
	t.Run("the Nth fails, the N+1th answers", func(t *testing.T) {
		e := newEnv(t, envOptions{rate: -1})
		got := answers(t, e, 4, "/v1/orders", "code=503; times=2", key)
		if want := []string{"503 code=503", "503 code=503", "200 ", "200 "}; !slices.Equal(got, want) {
			t.Errorf("four requests with code=503; times=2 answer %q, want %q", got, want)
		}
		rep := e.get(t, "/v1/orders/ord_sbx_0001", key, "Prefer", `delay=0, code=429; times="1", clock="2026-11-01T09:30:00Z"`)
		if rep.status != 429 || rep.header.Get("Retry-After") != "1" || rep.header.Get("Preference-Applied") != `delay=0, code=429, clock="2026-11-01T09:30:00Z"` {
			t.Errorf("the first of a sequence = %s, Retry-After %q, Preference-Applied %q", rep, rep.header.Get("Retry-After"), rep.header.Get("Preference-Applied"))
		}
		rep = e.get(t, "/v1/orders/ord_sbx_0001", key, "Prefer", `delay=0, code=429; times="1", clock="2026-11-01T09:30:00Z"`)
		if rep.status != 200 || rep.header.Get("Preference-Applied") != `delay=0, clock="2026-11-01T09:30:00Z"` {
			t.Errorf("past its times = %s, Preference-Applied %q; want 200 with delay and clock applied, not code", rep, rep.header.Get("Preference-Applied"))
		}
	})
	t.Run("sequences apart", func(t *testing.T) {
		e := newEnv(t, envOptions{rate: -1})
		for _, seq := range []struct{ target, prefer, key string }{
			{"/v1/orders?limit=1", "code=503; times=1", key},
			{"/v1/orders?limit=2", "code=503; times=1", key},                      // another query
			{"/v1/orders?limit=01", "code=503; times=1", key},                     // the target as sent
			{"/v1/orders?limit=1", `code=503; times=1, run="t-1"`, key},           // another Prefer value
			{"/v1/orders?limit=1", "code=503; times=1", "sk_test_other_all"},      // another tenant
			{"/v1/orders?limit=1", "code=503; times=1", "sk_test_sandbox_orders"}, // another key of the tenant: the same sequence
		} {
			got := answers(t, e, 1, seq.target, seq.prefer, seq.key)[0]
			want := "503 code=503"
			if seq.key == "sk_test_sandbox_orders" {
				want = "200 "
			}
			if got != want {
				t.Errorf("%s %q with %s = %s, want %s", seq.target, seq.prefer, seq.key, got, want)
			}
		}
		if r := e.do(t, newRequest(http.MethodHead, "/v1/orders?limit=1", key, "Prefer", "code=503; times=1")); r.status != 503 {
			t.Errorf("HEAD, another method = %d, want 503", r.status)
		}
	})
	t.Run("forgotten 60 s after its last request", func(t *testing.T) {
		e := newEnv(t, envOptions{rate: -1, step: -1})
		var got []string
		for _, wait := range []time.Duration{0, 59 * time.Second, 59 * time.Second, 60 * time.Second} {
			e.clock.advance(wait)
			got = append(got, answers(t, e, 1, "/v1/orders", "code=503; times=1", key)...)
		}
		if want := []string{"503 code=503", "200 ", "200 ", "503 code=503"}; !slices.Equal(got, want) {
			t.Errorf("requests 0, 59, 118 and 178 s apart answer %q, want %q: the idle time counts from the last request", got, want)
		}
	})
	t.Run("failing before the Prefer step is not counted", func(t *testing.T) {
		e := newEnv(t, envOptions{rate: 1, step: -1})
		prefer := "code=503; times=1"
		r := newRequest(http.MethodGet, "/v1/orders", key, "Prefer", prefer)
		r.Header.Set("Content-Length", strconv.Itoa(maxBodyBytes+1))
		r.ContentLength = maxBodyBytes + 1
		for _, before := range []reply{e.get(t, "/v1/orders", "sk_test_nope", "Prefer", prefer), e.get(t, "/v1/orders", "sk_test_sandbox_tracking", "Prefer", prefer), e.do(t, r)} {
			if before.status != 401 && before.status != 403 && before.status != 413 {
				t.Fatalf("a request failing before Prefer = %s", before)
			}
		}
		if rep := e.get(t, "/v1/orders", key, "Prefer", prefer); rep.status != 503 {
			t.Errorf("the first request to reach Prefer = %s, want 503", rep)
		}
		if rep := e.get(t, "/v1/orders", key, "Prefer", prefer); rep.status != 429 || rep.header.Get("Preference-Applied") != "" {
			t.Errorf("the rate limit's 429 = %s (Preference-Applied %q), want 429 of the limiter", rep, rep.header.Get("Preference-Applied"))
		}
		e.clock.advance(time.Second)
		if rep := e.get(t, "/v1/orders", key, "Prefer", prefer); rep.status != 200 {
			t.Errorf("the second request to reach Prefer = %s, want 200: the 429 was not counted", rep)
		}
	})
	t.Run("one aborted during its delay is counted", func(t *testing.T) {
		e := newEnv(t, envOptions{rate: -1})
		ts := httptest.NewServer(e.h)
		defer ts.Close()
		prefer := "code=503; times=1, delay=300"
		req, _ := http.NewRequest(http.MethodGet, ts.URL+"/v1/orders", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Prefer", prefer)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := http.DefaultClient.Do(req.WithContext(ctx))
			done <- err
		}()
		waitFor(t, "the request to reach its delay", func() bool { return e.sb.tenants.byID[seedTenant].heldSequences() == 1 })
		cancel()
		if err := <-done; err == nil {
			t.Fatal("the client did not give up during the delay")
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Errorf("after one aborted during its delay, the sequence's next = %d, want 200", res.StatusCode)
		}
	})
	t.Run("10,000 a tenant, the least recently used forgotten", func(t *testing.T) {
		e := newEnv(t, envOptions{rate: -1, quiet: true})
		run := func(i int) string {
			rec := httptest.NewRecorder()
			e.h.ServeHTTP(rec, newRequest(http.MethodGet, "/v1/orders/x", key, "Prefer", fmt.Sprintf(`code=500; times=1, run="s-%d"`, i)))
			return strconv.Itoa(rec.Code)
		}
		for i := range maxSequences {
			run(i)
		}
		run(1) // now the most recently used: s-0 is the least
		run(maxSequences)
		tenant := e.sb.tenants.byID[seedTenant]
		if held := tenant.heldSequences(); held != maxSequences {
			t.Errorf("a tenant holds %d sequences, want %d", held, maxSequences)
		}
		if got := run(0) + " " + run(1); got != "500 404" {
			t.Errorf("the least recently used and the one used since answer %s, want 500 (forgotten: afresh) and 404 (past its times)", got)
		}
	})
}

// TestSequencesHoldTheirBoundOnTheHeap: a tenant's sequences at their bound, each named by
// a target and a Prefer near the header limit, read as net/http reads them: a sequence keeps
// the digest of its identity, not the strings, so 10,000 of them hold some 2 MB of heap
// whatever the requests held. Not parallel: it measures the heap.
func TestSequencesHoldTheirBoundOnTheHeap(t *testing.T) {
	const perSequence = 256 // bytes of heap
	e := newEnv(t, envOptions{rate: -1, quiet: true, journal: -1})
	pad := strings.Repeat("x", 30<<10)
	held := heapGrowth(t, e.h, maxSequences+100, http.StatusInternalServerError, func(i int) *http.Request { // the first of each sequence
		return readRequest(t, fmt.Sprintf("GET /v1/orders/x?pad%d=%s HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nAuthorization: Bearer sk_test_sandbox_all\r\nPrefer: code=500; times=1, x=%s\r\n\r\n", i, pad, pad))
	})
	t.Logf("%d sequences hold %d bytes of heap, %d each", maxSequences, held, held/maxSequences)
	if n := e.sb.tenants.byID[seedTenant].heldSequences(); n != maxSequences {
		t.Errorf("the tenant holds %d sequences, want %d", n, maxSequences)
	}
	if held > maxSequences*perSequence {
		t.Errorf("%d sequences hold %d bytes of heap, want at most %d each", maxSequences, held, perSequence)
	}
}

// TestFaultsAreSaid: the banner and the page say when faults are on, and at what rate.
func TestFaultsAreSaid(t *testing.T) {
	t.Parallel()
	_, stdout, _, stop := startRun(t, "-faults", "rate=0.05,codes=503|429,seed=7")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	want := "-faults rate=0.05,codes=503|429,seed=7: 5% of the requests to the four operations that name no Prefer code fail (503, 429), the same ones at every start."
	if !strings.Contains(stdout.String(), "Faults are on: "+want+"\n") {
		t.Errorf("the banner does not say %q:\n%s", want, stdout)
	}
	page := string(newEnv(t, envOptions{faults: "rate=0.000001"}).get(t, "/", "").body)
	if want := "<b>Faults are on</b>: -faults rate=0.000001: 0.0001% of the requests"; !strings.Contains(page, want) {
		t.Errorf("the page does not say %q", want)
	}
	if page := string(newEnv(t, envOptions{}).get(t, "/", "").body); strings.Contains(page, "Faults") {
		t.Error("the page speaks of faults while -faults is off")
	}
}

// faultOf is the contract's rule for the k-th request of a tenant under -faults, computed
// apart from the sandbox's, in exact fractions: h is the first 8 bytes of the SHA-256 of
// "S/account/environment/k" over 2^64; under the rate it fails, with codes[floor(h/R*n)].
func faultOf(seed, account, environment string, k int, rate string, codes []string) string {
	sum := sha256.Sum256([]byte(seed + "/" + account + "/" + environment + "/" + strconv.Itoa(k)))
	h := new(big.Rat).SetFrac(new(big.Int).SetBytes(sum[:8]), new(big.Int).Lsh(big.NewInt(1), 64))
	r, _ := new(big.Rat).SetString(rate)
	if h.Cmp(r) >= 0 {
		return ""
	}
	at := new(big.Rat).Mul(new(big.Rat).Quo(h, r), big.NewRat(int64(len(codes)), 1))
	return codes[new(big.Int).Quo(at.Num(), at.Denom()).Int64()]
}

// TestFaults: -faults fails the k-th request to the four operations of a tenant that names
// no Prefer code exactly as the rule says, the same ones at every start, with every code it
// names; Prefer code and the test helpers are left alone; delay and clock still apply.
func TestFaults(t *testing.T) {
	t.Parallel()
	const key = "sk_test_sandbox_all"
	statuses := func(t *testing.T, e *env, n int) []string {
		var got []string
		for k := range n {
			got = append(got, strconv.Itoa(e.get(t, operations[k%len(operations)].target, key).status))
		}
		return got
	}
	t.Run("as the rule says", func(t *testing.T) {
		e := newEnv(t, envOptions{rate: -1, faults: "rate=0.3,codes=503|429|500|502,seed=7"})
		got := statuses(t, e, 300)
		var want []string
		for k := 1; k <= 300; k++ {
			code := faultOf("7", "acct_sandbox", "test", k, "0.3", []string{"503", "429", "500", "502"})
			want = append(want, cmp.Or(code, "200"))
		}
		if !slices.Equal(got, want) {
			t.Errorf("300 requests under rate=0.3 answer\n%v\nthe rule says\n%v", got, want)
		}
		for _, code := range []string{"503", "429", "500", "502"} {
			if !slices.Contains(got, code) {
				t.Errorf("no request failed with %s", code)
			}
		}
	})
	t.Run("the same seed, the same requests", func(t *testing.T) {
		a, b := statuses(t, newEnv(t, envOptions{rate: -1, faults: "rate=0.5,seed=42"}), 100), statuses(t, newEnv(t, envOptions{rate: -1, faults: "rate=0.5,seed=42"}), 100)
		c := statuses(t, newEnv(t, envOptions{rate: -1, faults: "rate=0.5,seed=43"}), 100)
		if !slices.Equal(a, b) || slices.Equal(a, c) {
			t.Errorf("seed 42 twice: %v and %v; seed 43: %v; want the same twice, and another seed another", a, b, c)
		}
	})
	t.Run("rate 0 and 1", func(t *testing.T) {
		for spec, want := range map[string]string{"rate=0": "200", "rate=1.0,codes=502": "502"} {
			for _, got := range statuses(t, newEnv(t, envOptions{rate: -1, faults: spec}), 40) {
				if got != want {
					t.Errorf("-faults %s answered %s, want %s every time", spec, got, want)
				}
			}
		}
	})
	t.Run("the test helpers and the pages without a key are never faulted", func(t *testing.T) {
		e := newEnv(t, envOptions{rate: -1, faults: "rate=1"})
		for _, target := range []string{"/v1/test_helpers/clock", "/v1/healthz", "/healthz", "/v1/openapi.json", "/"} {
			if rep := e.get(t, target, key); rep.status != 200 {
				t.Errorf("GET %s under rate=1 = %s, want 200", target, rep)
			}
		}
		if rep := e.do(t, newBodyRequest(http.MethodPost, "/v1/test_helpers/clock", key, `{"frozen_time":null}`)); rep.status != 200 {
			t.Errorf("POST clock under rate=1 = %s, want 200", rep)
		}
	})
	t.Run("a request naming a code is Prefer's, and not counted", func(t *testing.T) {
		e := newEnv(t, envOptions{rate: -1, faults: "rate=0.5,codes=429,seed=7"})
		prefer := e.get(t, "/v1/orders", key, "Prefer", "code=500")
		past := []reply{e.get(t, "/v1/orders", key, "Prefer", "code=502; times=1"), e.get(t, "/v1/orders", key, "Prefer", "code=502; times=1")}
		if prefer.status != 500 || past[0].status != 502 || past[1].status != 200 {
			t.Errorf("naming a code under -faults: %d, then %d and %d; want 500, 502 and 200 (past its times, a code still names one)", prefer.status, past[0].status, past[1].status)
		}
		want := cmp.Or(faultOf("7", "acct_sandbox", "test", 1, "0.5", []string{"429"}), "200")
		if got := strconv.Itoa(e.get(t, "/v1/orders", key).status); got != want {
			t.Errorf("the first request naming no code = %s, want %s: the rule's k=1", got, want)
		}
	})
	t.Run("delay and clock still apply", func(t *testing.T) {
		e := newEnv(t, envOptions{rate: -1, faults: "rate=1,codes=503|429,seed=3"})
		rep := e.get(t, "/v1/orders/ord_sbx_0001", key, "Prefer", `delay=0, clock="start"`)
		p := rep.problem(t)
		want := "Injected by -faults rate=1,codes=503|429,seed=3: request 1 of acct_sandbox/test to the operations fails."
		if rep.status < 429 || rep.header.Get("Preference-Applied") != `delay=0, clock="2026-11-22T12:00:00Z"` || rep.header.Get("Retry-After") != "1" || !strings.HasPrefix(p.Detail, want) {
			t.Errorf("a fault with Prefer delay and clock = %s, Preference-Applied %q, Retry-After %q; want the detail to begin %q", rep, rep.header.Get("Preference-Applied"), rep.header.Get("Retry-After"), want)
		}
	})
}

// TestADelayWatchesAClientThatSentABody: net/http watches a connection only once the body
// is read, so a Prefer delay reads it first: a client with a body that goes away during
// the delay is logged 499 at once and changes nothing; the body is judged after the delay.
func TestADelayWatchesAClientThatSentABody(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	conn, err := net.Dial("tcp", serveTCP(t, e.h, defaultConfig()))
	if err != nil {
		t.Fatal(err)
	}
	body := `{"frozen_time":"2020-01-01T00:00:00Z"}`
	io.WriteString(conn, "POST /v1/test_helpers/clock HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk_test_sandbox_all\r\nPrefer: delay=3000\r\n"+
		"Content-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
	conn.Close()
	start := time.Now()
	waitFor(t, "the gone client's request to be logged 499", func() bool {
		return strings.Contains(e.logs.String(), `"route":"/v1/test_helpers/clock","status":499`)
	})
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the gone client was noticed after %v, want at once, not after the delay", took)
	}
	if c := e.readClock(t, "sk_test_sandbox_all"); c.FrozenTime != "" {
		t.Errorf("the clock is %+v after an aborted request, want it unchanged", c)
	}
	// A body is judged after the delay: over the cap, 413; not JSON, 400.
	for _, tt := range []struct {
		body string
		code string
	}{{strings.Repeat(" ", maxBodyBytes+1), "body_too_large"}, {"frozen", "malformed_json"}} {
		start := time.Now()
		r := newBodyRequest(http.MethodPost, "/v1/test_helpers/clock", "sk_test_sandbox_all", tt.body, "Prefer", "delay=50")
		r.ContentLength = -1 // streamed: not refused before the key
		rep := e.do(t, r)
		if took := time.Since(start); took < 50*time.Millisecond || string(rep.problem(t).Code) != tt.code {
			t.Errorf("a %d-byte body with delay=50 = %s after %v, want %s after the delay", len(tt.body), rep, took, tt.code)
		}
	}
}

// TestPreferClock: Prefer clock judges one request's resources at its instant and stores
// nothing, beside a tenant clock moved elsewhere; the key is still judged by the tenant's
// clock; Preference-Applied echoes it in the order sent; the clock operations ignore it.
func TestPreferClock(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, step: -1})
	const key = "sk_test_sync_all"
	e.setClock(t, key, formatTimestamp(testNow.Add(2*time.Minute))) // everything has happened
	at90 := testNow.Add(90 * time.Second)
	for _, tt := range []struct {
		prefer, applied string
		list            string
	}{
		{`clock="` + formatTimestamp(testNow) + `"`, `clock="2026-11-22T12:00:00Z"`, "0005:unfulfilled:- 0004:fulfilled:- 0003:unfulfilled:- 0001:unfulfilled:-"},
		{"clock=2026-11-22T13:01:30+01:00", `clock="2026-11-22T12:01:30Z"`, "0006:unfulfilled:- 0005:cancelled:- 0004:fulfilled:- 0003:unfulfilled:- 0002:unfulfilled:- 0001:partially_fulfilled:shp_sync_1"},
		{`delay=0, Clock="2026-11-22T12:00:45.5Z", clock="2000-01-01T00:00:00Z"`, `delay=0, clock="2026-11-22T12:00:45.5Z"`, "0006:unfulfilled:- 0005:cancelled:- 0004:fulfilled:- 0003:unfulfilled:- 0001:unfulfilled:-"},
		// Relative to the start instant, as the clock's body and a dataset write them.
		{`clock="start+90s"`, `clock="2026-11-22T12:01:30Z"`, "0006:unfulfilled:- 0005:cancelled:- 0004:fulfilled:- 0003:unfulfilled:- 0002:unfulfilled:- 0001:partially_fulfilled:shp_sync_1"},
		{`clock=start`, `clock="2026-11-22T12:00:00Z"`, "0005:unfulfilled:- 0004:fulfilled:- 0003:unfulfilled:- 0001:unfulfilled:-"},
		{`clock="start-1m30.5s"`, `clock="2026-11-22T11:58:29.5Z"`, "0004:fulfilled:- 0003:unfulfilled:- 0001:unfulfilled:-"},
	} {
		rep := e.get(t, "/v1/orders", key, "Prefer", tt.prefer)
		if got := rep.header.Get("Preference-Applied"); got != tt.applied {
			t.Errorf("Prefer %s: Preference-Applied %q, want %q", tt.prefer, got, tt.applied)
		}
		var items []string
		for _, o := range decodePage(t, rep).Data {
			link := "-"
			if o.ShipmentID != nil {
				link = *o.ShipmentID
			}
			items = append(items, strings.TrimPrefix(o.ID, "ord_sync_")+":"+o.Status+":"+link)
		}
		if strings.Join(items, " ") != tt.list {
			t.Errorf("Prefer %s lists %v, want %s", tt.prefer, items, tt.list)
		}
	}
	// Every operation reads it; nothing is stored.
	wantProblem(t, e.get(t, "/v1/orders/ord_sync_0002", key, "Prefer", `clock="`+formatTimestamp(testNow)+`"`), 404, "not_found", "")
	wantProblem(t, e.get(t, "/v1/tracking/SYNC1000000001", key, "Prefer", `clock="`+formatTimestamp(at90.Add(-time.Minute))+`"`), 404, "not_found", "")
	if n, status := eventsOf(t, e.get(t, "/v1/shipments/shp_sync_1/tracking", key, "Prefer", `clock="`+formatTimestamp(at90)+`"`)); n != 1 || status != "pre_transit" {
		t.Errorf("shp_sync_1 at +90s: %d events, %s", n, status)
	}
	if c := e.readClock(t, key); c.FrozenTime != "2026-11-22T12:02:00Z" {
		t.Errorf("the tenant's clock is %+v after requests with Prefer clock, want it where it was", c)
	}
	// With code: echoed in the order sent, the code answers.
	rep := e.get(t, "/v1/orders", key, "Prefer", `clock="2026-11-22T12:00:00Z", code=503`)
	wantProblem(t, rep, 503, "provider_unavailable", "")
	if got := rep.header.Get("Preference-Applied"); got != `clock="2026-11-22T12:00:00Z", code=503` {
		t.Errorf("Preference-Applied %q", got)
	}
	// A bad value is 422 naming Prefer, judged with code and delay in the order sent.
	for _, tt := range []struct{ prefer, code string }{
		{`clock="yesterday"`, "invalid_parameter"},
		{`clock="start+"`, "invalid_parameter"},
		{`clock="start + 90s"`, "invalid_parameter"},
		{`clock="START+90s"`, "invalid_parameter"},
		{`clock="2026-11-22T12:00:00"`, "invalid_parameter"},
		{"clock=2026-11-22T12:00:00+01:00", ""},
		{`clock="2026-11-22T24:00:00Z"`, "invalid_parameter"},
		{`code=418, clock="bad"`, "invalid_parameter"},
		{`clock="bad", code=503`, "invalid_parameter"},
		{`clock="2026-11-22T12:00:00Z", clock="bad"`, ""},
	} {
		rep := e.get(t, "/v1/orders", key, "Prefer", tt.prefer)
		if tt.code == "" {
			if rep.status != 200 {
				t.Errorf("Prefer %s = %s, want 200", tt.prefer, rep)
			}
			continue
		}
		p := wantProblem(t, rep, 422, tt.code, "Prefer")
		if strings.Contains(tt.prefer, "code=418") != strings.Contains(p.Detail, "code") {
			t.Errorf("Prefer %s: detail %q, want the first fault sent", tt.prefer, p.Detail)
		}
	}
	// The key is judged by the tenant's clock, before Prefer: an expired key stays expired.
	wantProblem(t, e.get(t, "/v1/orders", "sk_test_sandbox_expired", "Prefer", `clock="2025-01-01T00:00:00Z"`), 401, "expired_api_key", "")
	// The clock operations ignore it: neither applied nor echoed, a bad one no fault.
	for _, prefer := range []string{`clock="2000-01-01T00:00:00Z"`, `clock="bad"`} {
		rep := e.get(t, "/v1/test_helpers/clock", key, "Prefer", prefer)
		if c := decodeClock(t, rep); c.Now != "2026-11-22T12:02:00Z" || rep.header.Get("Preference-Applied") != "" {
			t.Errorf("GET clock with Prefer %s = %+v, Preference-Applied %q; want the tenant's clock, nothing applied", prefer, c, rep.header.Get("Preference-Applied"))
		}
	}
	// Parallel tests on one tenant each keep their own time.
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			at := testNow.Add(time.Duration(i) * 15 * time.Second)
			for range 50 {
				rec := httptest.NewRecorder()
				e.h.ServeHTTP(rec, newRequest(http.MethodGet, "/v1/orders/ord_sync_0002", key, "Prefer", `clock="`+formatTimestamp(at)+`"`))
				if found := rec.Code == 200; found != !at.Before(at90) {
					t.Errorf("at %s ord_sync_0002 answered %d", formatTimestamp(at), rec.Code)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func FuzzParsePrefer(f *testing.F) {
	for _, s := range []string{"code=503", "delay=100", "code=500, delay=10000", `code="429"; x=y`, "respond-async", "code=200", "delay=-1", `a="b,c", code=502`, ";;,=", "",
		`clock="2026-11-01T09:30:00Z"`, "clock=2026-11-01T09:30:00+01:00, code=503", `clock="yesterday"`, `clock="start+90s"`,
		"code=503; times=2", "code=503, times=2", "times=2", `code=503; times="2"`, "code=503; time=2", "code=503; times=2; times=3",
		"code=500, code=502; times=0", "code=429;TIMES=100", "delay=5; times=1", `run="t-42"`, "run=bad!", `code=503; times=2, run="x", delay=0`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, header string) {
		p, err := parsePrefer([]string{header}, withClock, testNow)
		if err != nil {
			if e := asAPIError(err); e == nil || e.code != codeInvalidParameter || e.param == nil || *e.param != "Prefer" {
				t.Fatalf("parsePrefer(%q) = %+v, want invalid_parameter naming Prefer", header, err)
			}
			return
		}
		applied := p.appliedHeader(true)
		if p.delay < 0 || p.delay > maxPreferDelay || p.clock != nil && !strings.Contains(applied, `clock="`+formatTimestamp(*p.clock)+`"`) {
			t.Fatalf("parsePrefer(%q) accepted %+v", header, p)
		}
		// times is code's: 1 to 100, sent as a parameter of it, never echoed; run is checked
		// and never echoed either.
		if p.times < 0 || p.times > maxTimes || p.times > 0 && (p.code == nil || !strings.Contains(strings.ToLower(header), "times")) ||
			strings.Contains(strings.ToLower(applied), "times") || p.run != "" && !validRun(p.run) || strings.Contains(applied, "run") {
			t.Fatalf("parsePrefer(%q) accepted times %d, run %q, applied %q", header, p.times, p.run, applied)
		}
		if without := p.appliedHeader(false); p.code != nil && strings.Contains(without, "code=") {
			t.Fatalf("parsePrefer(%q): without its code, Preference-Applied is %q", header, without)
		}
		if q, err := parsePrefer([]string{header}, codeAndDelay, testNow); err == nil && q.clock != nil || err != nil && strings.Contains(err.Error(), "clock") {
			t.Fatalf("parsePrefer(%q) without the clock read it: %+v, %v", header, q, err)
		}
	})
}

// ===== main.go, serve and landing: what needs no key, and the landing page =====

// main.go, what needs no key: the OpenAPI document, the README's examples, the landing
// page, CORS.

// TestOpenAPIRoutes: every documented path and method is routed, and every route is
// documented.
func TestOpenAPIRoutes(t *testing.T) {
	t.Parallel()
	doc := theOpenAPI(t)
	var documented []string
	for _, p := range doc.paths {
		for method := range p.item {
			switch method {
			case "get", "put", "post", "delete", "options", "head", "patch", "trace":
				documented = append(documented, strings.ToUpper(method)+" "+p.template)
			}
		}
	}
	s, err := newServer(&sandbox{}, serverOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The document describes what lives under the base URL: / is a page for people, and
	// /healthz is /v1/healthz for probes that know no base URL.
	var routed []string
	for _, rt := range s.routes() {
		method, path, _ := strings.Cut(rt.pattern, " ")
		if !strings.HasPrefix(path, "/v1/") {
			if path == "/healthz" && !slices.Contains(documented, "GET /v1/healthz") {
				t.Errorf("/healthz is routed, /v1/healthz is not documented")
			}
			continue
		}
		routed = append(routed, rt.pattern)
		if method == "GET" {
			routed = append(routed, "HEAD "+path) // a GET pattern serves HEAD
		}
	}
	slices.Sort(documented)
	slices.Sort(routed)
	if !slices.Equal(documented, routed) {
		t.Errorf("documented operations %v\nrouted %v", documented, routed)
	}
}

// docExample is one example of a documented response, with the request that produces it
// and, for the journal's reads, the requests made before it (x-sandbox-before).
type docExample struct {
	where   string
	status  int
	schema  any
	value   any
	request docRequest
	before  []docRequest
	wait    time.Duration // between the requests before and the request (x-sandbox-wait-seconds), on the env's clock
}

type docRequest struct {
	Method    string            `json:"method"`
	Path      string            `json:"path"`
	Headers   map[string]string `json:"headers"`
	BodyBytes int               `json:"body_bytes"`
	Body      string            `json:"body"`
}

func docExamples(t *testing.T, doc *openAPI) []docExample {
	t.Helper()
	var out []docExample
	seen := map[string]bool{}
	for _, p := range doc.paths {
		for method, op := range p.item {
			responses := asMap(asMap(op)["responses"])
			for status, r := range responses {
				ref, _ := asMap(r)["$ref"].(string)
				resp := doc.resolve(r)
				key := ref
				if key == "" {
					key = p.template + method + status
				}
				if seen[key] {
					continue
				}
				seen[key] = true
				code, _ := strconv.Atoi(status)
				for ct, m := range asMap(resp["content"]) {
					media := asMap(m)
					for name, ex := range asMap(media["examples"]) {
						e := docExample{where: fmt.Sprintf("%s %s %s %s example %s", method, p.template, status, ct, name), status: code, schema: media["schema"], value: asMap(ex)["value"]}
						raw, _ := json.Marshal(asMap(ex)["x-sandbox-request"])
						if err := json.Unmarshal(raw, &e.request); err != nil || e.request.Path == "" {
							t.Errorf("%s: no x-sandbox-request", e.where)
							continue
						}
						if s, err := strconv.Atoi(fmt.Sprint(asMap(ex)["x-sandbox-wait-seconds"])); err == nil {
							e.wait = time.Duration(s) * time.Second
						}
						if before, ok := asMap(ex)["x-sandbox-before"]; ok {
							raw, _ := json.Marshal(before)
							if err := json.Unmarshal(raw, &e.before); err != nil {
								t.Errorf("%s: x-sandbox-before: %v", e.where, err)
							}
						}
						out = append(out, e)
					}
				}
			}
		}
	}
	if len(out) < 20 {
		t.Fatalf("only %d examples found", len(out))
	}
	return out
}

// normalizedJSON re-encodes a JSON value with sorted keys and without what differs at
// every request: request_id, and a journal entry's at and duration_ms.
func normalizedJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(withoutVarying(v))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func withoutVarying(v any) any {
	switch v := v.(type) {
	case map[string]any:
		m := map[string]any{}
		for k, x := range v {
			m[k] = withoutVarying(x)
		}
		delete(m, "request_id")
		if _, sandbox := m["idle_seconds"]; sandbox { // a sandbox made: its account and keys are random
			delete(m, "account")
		}
		if id, _ := m["id"].(string); examIDPattern.MatchString(id) { // an exam's attempt: its id and account are random
			delete(m, "id")
			delete(m, "account")
		}
		if k, ok := m["key"].(string); ok && strings.HasPrefix(k, "sk_test_") && len(k) == 40 {
			delete(m, "key")
		}
		if _, entry := m["seq"]; entry {
			delete(m, "at")
			delete(m, "duration_ms")
			if k, _ := m["key"].(string); regexp.MustCompile(`^sk_test_\.\.\.[a-z2-7]{4}$`).MatchString(k) { // a random key's mask
				delete(m, "key")
			}
		}
		return m
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = withoutVarying(x)
		}
		return out
	}
	return v
}

// TestTheDocumentServesGeneratedSuites: what tools that build suites from the document
// (Portman with Newman, Schemathesis, a Prism proxy) read of it works as they read it: no
// example asks for a failure (a suite sends them as they are); each write's example has an
// Idempotency-Key of its own (a second write under one key would be 409); the key's pattern
// is the server's grammar (a generator keeps to it); the operations that need a sandbox's
// key are flagged, so that a suite of one credential can leave them out; and every link
// names an operation, its parameters, and a member its response holds.
func TestTheDocumentServesGeneratedSuites(t *testing.T) {
	t.Parallel()
	doc := theOpenAPI(t)
	type operation struct {
		path, method string
		op           map[string]any
	}
	var ops []operation
	byID := map[string]operation{}
	for path, item := range asMap(doc.root["paths"]) {
		for method, op := range asMap(item) {
			if o := asMap(op); o["operationId"] != nil {
				ops = append(ops, operation{path, method, o})
				byID[o["operationId"].(string)] = operation{path, method, o}
			}
		}
	}
	parameter := func(op map[string]any, name string) map[string]any {
		params, _ := op["parameters"].([]any)
		for _, p := range params {
			if q := doc.resolve(p); q["name"] == name {
				return q
			}
		}
		return nil
	}
	examplesOf := func(node map[string]any) []any {
		var values []any
		if v, ok := node["example"]; ok {
			values = append(values, v)
		}
		for _, ex := range asMap(node["examples"]) {
			values = append(values, doc.resolve(ex)["value"])
		}
		return values
	}
	t.Run("no example asks for a failure", func(t *testing.T) {
		seen := 0
		for _, o := range ops {
			if p := parameter(o.op, "Prefer"); p != nil {
				for _, v := range examplesOf(p) {
					seen++
					if prefs := fmt.Sprint(v); regexp.MustCompile(`(?i)(^|[,\s])(code|delay|times)\s*=`).MatchString(prefs) {
						t.Errorf("%s %s: a Prefer example asks for a failure or a wait: %s", o.method, o.path, prefs)
					}
				}
			}
		}
		if seen == 0 {
			t.Error("no Prefer example found: the check checks nothing")
		}
	})
	t.Run("each write its own key", func(t *testing.T) {
		keys := map[string]string{}
		for _, o := range ops {
			p := parameter(o.op, "Idempotency-Key")
			if p == nil {
				continue
			}
			for _, v := range examplesOf(p) {
				if other, ok := keys[fmt.Sprint(v)]; ok {
					t.Errorf("%s %s and %s share the Idempotency-Key example %v", o.method, o.path, other, v)
				}
				keys[fmt.Sprint(v)] = o.method + " " + o.path
				if _, err := parseIdempotencyKey([]string{fmt.Sprint(v)}); err != nil {
					t.Errorf("%s %s: the example %v is not a key", o.method, o.path, v)
				}
			}
		}
		if len(keys) != 5 {
			t.Errorf("Idempotency-Key examples: %v, want one for each of the five writes", keys)
		}
	})
	t.Run("the key's pattern is the grammar", func(t *testing.T) {
		schema := doc.resolve(asMap(doc.root["components"])["schemas"].(map[string]any)["IdempotencyKey"])
		pattern, _ := schema["pattern"].(string)
		if pattern == "" {
			t.Fatal("the Idempotency-Key has no pattern")
		}
		re := regexp.MustCompile(pattern)
		long := strings.Repeat("k", maxIdempotencyKey)
		for _, key := range []string{"a", "a1b2c3", `"a1b2c3"`, long, `"` + long + `"`, long + "k", "", `""`, `"`, `"a`, `a"`, `a"b`, `a\b`, "a b", "a\tb", "a\x00", "é", "~!#[]", "\x7f", "{}|^`"} {
			_, err := parseIdempotencyKey([]string{key})
			if re.MatchString(key) != (err == nil) {
				t.Errorf("%q: the pattern matches %v, the server takes it %v", key, re.MatchString(key), err == nil)
			}
		}
	})
	t.Run("the operations a sandbox's key needs are flagged", func(t *testing.T) {
		var flagged []string
		for _, o := range ops {
			if o.op["x-needs-sandbox-key"] == true {
				flagged = append(flagged, o.op["operationId"].(string))
			}
		}
		slices.Sort(flagged)
		if strings.Join(flagged, " ") != "addShipmentEvents answerExam createShipment deleteSandbox" {
			t.Errorf("flagged: %v, want addShipmentEvents, answerExam, createShipment and deleteSandbox", flagged)
		}
	})
	t.Run("the links resolve", func(t *testing.T) {
		links := 0
		for _, o := range ops {
			for code, r := range asMap(o.op["responses"]) {
				response := doc.resolve(r)
				for name, l := range asMap(response["links"]) {
					links++
					link := asMap(l)
					target, ok := byID[fmt.Sprint(link["operationId"])]
					if !ok {
						t.Errorf("%s %s %s, link %s: no operation %v", o.method, o.path, code, name, link["operationId"])
						continue
					}
					schema := doc.resolve(asMap(asMap(response["content"])["application/json"])["schema"])
					for param, expr := range asMap(link["parameters"]) {
						if parameter(target.op, param) == nil {
							t.Errorf("link %s: %s takes no parameter %s", name, link["operationId"], param)
						}
						pointer, ok := strings.CutPrefix(fmt.Sprint(expr), "$response.body#/")
						if !ok {
							t.Errorf("link %s: %v is not a pointer into the response body", name, expr)
							continue
						}
						node := schema
						for _, part := range strings.Split(pointer, "/") {
							if _, err := strconv.Atoi(part); err == nil {
								node = doc.resolve(node["items"])
							} else {
								node = doc.resolve(asMap(node["properties"])[part])
							}
							if node == nil {
								t.Errorf("link %s: the %s %s answer holds no %s", name, o.method, o.path, pointer)
								break
							}
						}
					}
				}
			}
		}
		if links == 0 {
			t.Error("no link found: the check checks nothing")
		}
	})
}

// TestOpenAPIExamplesMatchTheServer: every documented example is, after JSON
// normalization, exactly what the server answers to the request it names, in a sandbox of
// its own whose wall clock stands at its start (an example may move the clock).
func TestOpenAPIExamplesMatchTheServer(t *testing.T) {
	t.Parallel()
	doc := theOpenAPI(t)
	for _, ex := range docExamples(t, doc) {
		e := newEnv(t, envOptions{step: -1, quiet: true})
		sandboxKey, examID := "", "" // the key of the sandbox (or attempt) a request before made, "{sandbox_key}" in a header; the attempt's id, "{exam_id}" in a path
		header := func(r *http.Request, h map[string]string) {
			for k, v := range h {
				r.Header.Set(k, strings.ReplaceAll(v, "{sandbox_key}", sandboxKey))
			}
		}
		for _, b := range ex.before {
			r := httptest.NewRequest(b.Method, "http://127.0.0.1:8080"+b.Path, strings.NewReader(b.Body))
			header(r, b.Headers)
			var made sandboxAnswer
			var attempt examStartedOut
			rep := e.do(t, r)
			if rep.status == http.StatusCreated && json.Unmarshal(rep.body, &made) == nil && len(made.Keys) > 0 {
				sandboxKey = made.Keys[0].Key
			}
			if rep.status == http.StatusCreated && json.Unmarshal(rep.body, &attempt) == nil && attempt.ID != "" {
				sandboxKey, examID = attempt.Key, attempt.ID
			}
		}
		e.clock.advance(ex.wait)
		var body io.Reader
		switch {
		case ex.request.BodyBytes > 0:
			body = bytes.NewReader(make([]byte, ex.request.BodyBytes))
		case ex.request.Body != "":
			body = strings.NewReader(ex.request.Body)
		}
		r := httptest.NewRequest(ex.request.Method, "http://127.0.0.1:8080"+strings.ReplaceAll(ex.request.Path, "{exam_id}", examID), body)
		header(r, ex.request.Headers)
		rep := e.do(t, r)
		dec := json.NewDecoder(bytes.NewReader(rep.body))
		dec.UseNumber()
		var got any
		if err := dec.Decode(&got); err != nil {
			t.Fatalf("%s: %v", ex.where, err)
		}
		if rep.status != ex.status || normalizedJSON(t, got) != normalizedJSON(t, ex.value) {
			t.Errorf("%s: the server answers %d %s\nthe document shows %d %s", ex.where, rep.status, normalizedJSON(t, got), ex.status, normalizedJSON(t, ex.value))
		}
	}
}

// TestOpenAPIExamplesCoverTheSchemas: every example validates against its schema, and the
// examples together show every property of every object schema, so that a property the
// server does not produce cannot sit in the document unnoticed (an example showing it
// would differ from the server's answer).
func TestOpenAPIExamplesCoverTheSchemas(t *testing.T) {
	t.Parallel()
	doc := theOpenAPI(t)
	observed := map[string]bool{}
	for _, ex := range docExamples(t, doc) {
		raw, _ := json.Marshal(ex.value)
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		var v any
		dec.Decode(&v)
		if err := doc.validate(ex.schema, v, "$", func(ref, prop string) { observed[ref+"#"+prop] = true }); err != nil {
			t.Errorf("%s does not validate: %v", ex.where, err)
		}
	}
	// Request bodies' examples too.
	for _, p := range doc.paths {
		for method, op := range p.item {
			for ct, m := range asMap(asMap(asMap(op)["requestBody"])["content"]) {
				for name, ex := range asMap(asMap(m)["examples"]) {
					raw, _ := json.Marshal(asMap(ex)["value"])
					dec := json.NewDecoder(bytes.NewReader(raw))
					dec.UseNumber()
					var v any
					if err := dec.Decode(&v); err != nil {
						t.Fatal(err)
					}
					if err := doc.validate(asMap(m)["schema"], v, "$", func(ref, prop string) { observed[ref+"#"+prop] = true }); err != nil {
						t.Errorf("%s %s request %s example %s does not validate: %v", method, p.template, ct, name, err)
					}
				}
			}
		}
	}
	for name, s := range asMap(asMap(doc.root["components"])["schemas"]) {
		for prop := range asMap(asMap(s)["properties"]) {
			if !observed["#/components/schemas/"+name+"#"+prop] {
				t.Errorf("schema %s property %q appears in no example", name, prop)
			}
		}
	}
}

func TestOpenAPIServedDocument(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	rep := e.get(t, "/v1/openapi.json", "")
	var served, file map[string]any
	if err := json.Unmarshal(rep.body, &served); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(openAPIDocument, &file); err != nil {
		t.Fatal(err)
	}
	if served["openapi"] != "3.1.0" {
		t.Errorf("openapi = %v, want 3.1.0", served["openapi"])
	}
	// Beyond the origin of its servers, the served document is openapi.json.
	origins := regexp.MustCompile(`"url":"http://[^/"]*`)
	if a, b := origins.ReplaceAllString(normalizedJSON(t, served), ""), origins.ReplaceAllString(normalizedJSON(t, file), ""); a != b {
		t.Error("the served document differs from openapi.json beyond the servers' origins")
	}
	// Every servers entry, at the top and on any path, names the address that serves it:
	// the request's Host when it is a host[:port], else the banner's.
	for host, want := range map[string]string{
		"127.0.0.1:8080":   "http://127.0.0.1:8080",
		"localhost:9999":   "http://localhost:9999",
		"[::1]:18080":      "http://[::1]:18080",
		"sandbox.internal": "http://sandbox.internal",
		"bad host":         "http://127.0.0.1:8080",
		"a/b":              "http://127.0.0.1:8080",
		"":                 "http://127.0.0.1:8080",
		"LOCALHOST:8080":   "http://localhost:8080",
		"192.0.2.2:19183":  "http://192.0.2.2:19183",
		"example.com:80":   "http://example.com:80",
		"...":              "http://127.0.0.1:8080",
		"-":                "http://127.0.0.1:8080",
		"[:]":              "http://127.0.0.1:8080",
		"a.b:99999":        "http://127.0.0.1:8080",
		"a.b:0":            "http://127.0.0.1:8080",
		"a.b:080":          "http://127.0.0.1:8080",
		"1.2.3":            "http://127.0.0.1:8080",
		"01.2.3.4":         "http://127.0.0.1:8080",
		"[1.2.3.4]":        "http://127.0.0.1:8080",
		"a.b.":             "http://127.0.0.1:8080",
		"a-.b":             "http://127.0.0.1:8080",
		"[::1]x":           "http://127.0.0.1:8080",
	} {
		r := newRequest(http.MethodGet, "/v1/openapi.json", "")
		r.Host = host
		urls := regexp.MustCompile(`"url":"([^"]*)"`).FindAllStringSubmatch(string(e.do(t, r).body), -1)
		if len(urls) != 1 {
			t.Fatalf("Host %q: %d servers entries, want the top level's only", host, len(urls))
		}
		for _, u := range urls {
			if !strings.HasPrefix(u[1], want+"/") && u[1] != want {
				t.Errorf("Host %q: a servers entry is %s, want it at %s", host, u[1], want)
			}
		}
	}
}

// TestOpenAPIDocumentForClients: what generated clients and linters need of the served
// document: HEAD beside each GET, a described schema for the document itself, every error
// code with a description, bounds on the cursor, a license, no unused component, and no
// advice against the + rule.
// firstExampleName is the name of the first example of a request body in the document's
// text, as the tools that read it in order find it (a decoded map has no order).
func firstExampleName(t *testing.T, doc []byte, path, method string) string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(doc))
	want := []string{"paths", path, method, "requestBody", "content", "application/json", "examples"}
	depth, matched := 0, 0
	for {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("no examples of %s %s's request body: %v", method, path, err)
		}
		switch v := tok.(type) {
		case json.Delim:
			if v == '{' || v == '[' {
				depth++
			} else {
				depth--
			}
		case string:
			if depth == matched+1 && matched < len(want) && v == want[matched] {
				matched++
				if matched == len(want) {
					dec.Token() // {
					name, _ := dec.Token()
					return name.(string)
				}
			} else if depth == matched+1 {
				var skip json.RawMessage
				dec.Decode(&skip)
			}
		}
	}
}

func TestOpenAPIDocumentForClients(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	body := e.get(t, "/v1/openapi.json", "").body
	var doc map[string]any
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatal(err)
	}
	for path, item := range asMap(doc["paths"]) {
		_, get := asMap(item)["get"]
		_, head := asMap(item)["head"]
		if get != head {
			t.Errorf("%s: GET documented %v, HEAD documented %v; want HEAD beside each GET", path, get, head)
		}
	}
	// Test tools (Portman, Dredd, Prism) send the first example of every request body as it
	// is, with a dataset key: it leaves every dataset tenant as it found it, so that a suite
	// generated from the document passes twice.
	for path, item := range asMap(doc["paths"]) {
		for method, op := range asMap(item) {
			content := asMap(asMap(asMap(asMap(op)["requestBody"])["content"])["application/json"])
			if content == nil {
				continue
			}
			first, _ := json.Marshal(asMap(asMap(content["examples"])[firstExampleName(t, body, path, method)])["value"])
			before := e.get(t, "/v1/test_helpers/clock", "sk_test_sandbox_all").body
			e.do(t, newBodyRequest(strings.ToUpper(method), "/v1"+path, "sk_test_sandbox_all", string(first), "Content-Type", "application/json"))
			after := e.get(t, "/v1/test_helpers/clock", "sk_test_sandbox_all").body
			if strings.Split(string(before), `"now"`)[0] != strings.Split(string(after), `"now"`)[0] {
				t.Errorf("%s %s: the first example %s moved acct_sandbox's clock: %s, then %s", method, path, first, before, after)
			}
		}
	}
	self := asMap(asMap(asMap(asMap(asMap(asMap(asMap(doc["paths"])["/openapi.json"])["get"])["responses"])["200"])["content"])["application/json"])["schema"]
	if req := fmt.Sprint(asMap(self)["required"]); req != "[openapi info paths]" {
		t.Errorf("the document's own schema requires %s, want openapi, info and paths", req)
	}
	schemas := asMap(asMap(doc["components"])["schemas"])
	codeSchema := asMap(asMap(asMap(schemas["Problem"])["properties"])["code"])
	descriptions := asMap(codeSchema["x-enumDescriptions"])
	for c := range codeStatus {
		if d, _ := descriptions[string(c)].(string); !strings.HasPrefix(d, strconv.Itoa(codeStatus[c])+": ") || !strings.Contains(fmt.Sprint(codeSchema["description"]), string(c)+": ") {
			t.Errorf("code %s has no one-line description starting with its status: %q", c, d)
		}
	}
	if len(descriptions) != len(codeStatus) {
		t.Errorf("%d code descriptions, want %d", len(descriptions), len(codeStatus))
	}
	cursor := asMap(asMap(asMap(doc["components"])["parameters"])["Cursor"])["schema"]
	if n := fmt.Sprint(asMap(cursor)["maxLength"]); n != strconv.Itoa(maxCursorLen) {
		t.Errorf("cursor maxLength = %s, want %d (the longest cursor accepted)", n, maxCursorLen)
	}
	if license := asMap(asMap(doc["info"])["license"]); license["name"] == nil || license["identifier"] == nil && license["url"] == nil {
		t.Errorf("info.license = %v, want a name and an identifier or url", license)
	}
	// What lives under the base URL, as generators read it: no path-level servers (they
	// ignore them), no page for browsers; arrays with items; numbers typed as numbers; one
	// camelCase; scopes named where a bearer scheme has none to list.
	if _, ok := asMap(doc["paths"])["/"]; ok {
		t.Error("the document describes /, a page for browsers")
	}
	for path, item := range asMap(doc["paths"]) {
		if asMap(item)["servers"] != nil {
			t.Errorf("%s has servers of its own, which generators ignore", path)
		}
		for method, op := range asMap(item) {
			id, _ := asMap(op)["operationId"].(string)
			if method == "head" {
				get, _ := asMap(asMap(item)["get"])["operationId"].(string)
				if rest := strings.TrimPrefix(get, "get"); id != "head"+strings.ToUpper(rest[:1])+rest[1:] {
					t.Errorf("HEAD %s is %s, want the head of %s in camelCase", path, id, get)
				}
			}
			scopes := asSlice(asMap(op)["x-required-scopes"])
			for _, req := range asSlice(asMap(op)["security"]) {
				for scheme, list := range asMap(req) {
					if len(asSlice(list)) > 0 {
						t.Errorf("%s %s lists scopes %v for %s, an http scheme: name them in x-required-scopes", method, path, list, scheme)
					}
				}
			}
			if len(scopes) > 0 && method == "get" {
				target := "/v1" + strings.NewReplacer("{id}", "x", "{tracking_number}", "x").Replace(path)
				challenge := e.get(t, target, "sk_test_sandbox_none").header.Get("WWW-Authenticate")
				if want := fmt.Sprintf(`scope="%s"`, scopes[0]); !strings.Contains(challenge, want) {
					t.Errorf("GET %s names scopes %v; the server asks for %s", path, scopes, challenge)
				}
			}
		}
	}
	var arrays func(at string, node any)
	arrays = func(at string, node any) {
		if m := asMap(node); m != nil {
			if m["type"] == "array" && m["items"] == nil {
				t.Errorf("%s: an array without items", at)
			}
			for k, v := range m {
				arrays(at+"."+k, v)
			}
		}
		for i, v := range asSlice(node) {
			arrays(fmt.Sprintf("%s[%d]", at, i), v)
		}
	}
	arrays("$", doc)
	// The simulated answers, from their one table: Prefer names them all, and each one's
	// answer documents Retry-After exactly when the table says it carries it.
	prefer := fmt.Sprint(asMap(asMap(asMap(doc["components"])["parameters"])["Prefer"])["description"])
	if want := "code=" + strings.ReplaceAll(simulatedStatuses(), ", ", "|"); !strings.Contains(prefer, want+" ") {
		t.Errorf("the Prefer parameter does not name %s: %s", want, prefer)
	}
	list := asMap(asMap(asMap(asMap(doc["paths"])["/orders"])["get"])["responses"])
	for _, a := range simulatedAnswers {
		resp := asMap(list[a.status])
		if ref, ok := resp["$ref"].(string); ok {
			resp = asMap(asMap(asMap(doc["components"])["responses"])[strings.TrimPrefix(ref, "#/components/responses/")])
		}
		if _, documented := asMap(resp["headers"])["Retry-After"]; documented != a.retryAfter {
			t.Errorf("GET /v1/orders %s documents Retry-After %v; the simulated answer carries it: %v", a.status, documented, a.retryAfter)
		}
	}
	if typ := asMap(asMap(asMap(asMap(doc["components"])["headers"])["Retry-After"])["schema"])["type"]; typ != "integer" {
		t.Errorf("Retry-After is typed %v, want integer", typ)
	}
	for kind, items := range asMap(doc["components"]) {
		for name := range asMap(items) {
			if kind != "securitySchemes" && !bytes.Contains(body, []byte(`"#/components/`+kind+`/`+name+`"`)) {
				t.Errorf("component %s/%s is not used", kind, name)
			}
		}
	}
	if e.get(t, "/v1/healthz", "").status != 200 {
		t.Error("GET /v1/healthz, the document's /healthz under the base URL, does not answer")
	}
	if bytes.Contains(body, []byte("needs no escaping")) || !bytes.Contains(body, []byte("%2B")) {
		t.Error("the document advises against the + rule, or does not say to send + as %2B")
	}
}

// docPage is a page of the documentation: README.md, the start page, or one under docs/.
type docPage struct {
	name, text string
}

// docPages is the documentation in reading order: the start page, then the pages under docs/
// in the order it links them (each must be linked).
func docPages(t *testing.T) []docPage {
	t.Helper()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	pages := []docPage{{"README.md", string(readme)}}
	linked := map[string]bool{}
	for _, m := range regexp.MustCompile(`\]\((docs/[a-z0-9-]+\.md)\)`).FindAllStringSubmatch(string(readme), -1) {
		if linked[m[1]] {
			continue
		}
		linked[m[1]] = true
		text, err := os.ReadFile(m[1])
		if err != nil {
			t.Fatalf("README.md links %s: %v", m[1], err)
		}
		pages = append(pages, docPage{m[1], string(text)})
	}
	files, _ := filepath.Glob("docs/*.md")
	for _, f := range files {
		if !linked[f] {
			t.Errorf("%s is not linked from README.md", f)
		}
	}
	return pages
}

// needTools stops the test unless the tools the README's shell examples use are installed:
// it skips, saying which is missing, on a developer's machine; it fails under CI (CI set, as
// .ci/run and CI services set it), where an example passed unchecked would be a test that
// cannot fail. .ci/run installs them.
func needTools(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is not installed, and CI is set: the README's shell examples must run (.ci/run installs curl and jq)", tool)
			}
			t.Skipf("%s is not installed: the README's shell examples are not run (CI fails here)", tool)
		}
	}
}

// shellBlocks are a page's shell examples, each with the output it shows under it, if any.
func shellBlocks(text string) [][]string {
	return regexp.MustCompile("(?s)```sh\n(.*?)```\n(?:\n```(?:text|json)\n(.*?)\n```)?").FindAllStringSubmatch(text, -1)
}

// TestReadmeExamples: the shell examples of the README and of every page under docs/, run
// as written in the repository, in reading order: the quick start's go run . serves them
// (on a free port, named by SANDBOX_ADDR, in place of 127.0.0.1:8080); each block must exit
// 0, leave nothing listening on the ports it used, and print what the page shows under it,
// if it shows anything. Blocks without curl or the kit (go run . check) start a sandbox or
// need what go test does not assume (podman, npx): they are not run.
func TestReadmeExamples(t *testing.T) {
	t.Parallel()
	needTools(t, "bash", "curl", "jq", "go")
	pages := docPages(t)
	free := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().String()
	}
	listening := func(addr string) bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	}
	host := free()
	goRun := exec.Command("go", "run", ".")
	goRun.Env = append(os.Environ(), "SANDBOX_ADDR="+host)
	goRun.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // go run and the sandbox it starts
	if err := goRun.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { syscall.Kill(-goRun.Process.Pid, syscall.SIGTERM); goRun.Wait() }()
	for deadline := time.Now().Add(time.Minute); !listening(host); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("go run . did not serve within a minute")
		}
	}
	ran := 0
	for _, page := range pages {
		for i, b := range shellBlocks(page.text) {
			if strings.Contains(b[1], "curl") || strings.Contains(b[1], "go run . check") {
				ran++
				runShellBlock(t, page.name, i, b[1], b[2], host, free, listening)
			}
		}
	}
	if ran < 30 {
		t.Errorf("only %d shell blocks with curl found in the README and docs/", ran)
	}
}

// runShellBlock runs block i of a page against the sandbox at host, and checks what it prints.
func runShellBlock(t *testing.T, page string, i int, block, shown, host string, free func() string, listening func(string) bool) {
	ports := map[string]string{"127.0.0.1:8181": free(), "127.0.0.1:8282": free()}
	script := "set -euo pipefail\nH='Authorization: Bearer sk_test_sandbox_all'\nB=http://127.0.0.1:8080/v1\n" + block
	script = strings.NewReplacer("127.0.0.1:8080", host, "127.0.0.1:8181", ports["127.0.0.1:8181"], "127.0.0.1:8282", ports["127.0.0.1:8282"]).Replace(script)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	sh := exec.CommandContext(ctx, "bash", "-c", script)
	var stderr bytes.Buffer
	sh.Stderr = &stderr
	out, err := sh.Output()
	cancel()
	if err != nil {
		t.Errorf("%s shell block %d failed: %v\n%s\noutput:\n%s%s", page, i, err, block, out, stderr.Bytes())
		return
	}
	if shown != "" && strings.TrimSuffix(string(out), "\n") != shown {
		t.Errorf("%s shell block %d prints\n%s\nthe page shows\n%s", page, i, out, shown)
	}
	for _, port := range ports { // a sandbox the block stopped has 5 s to close its port
		for deadline := time.Now().Add(5 * time.Second); listening(port); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Errorf("%s shell block %d left a sandbox listening on %s:\n%s", page, i, port, block)
				break
			}
		}
	}
}

// TestReadmeIsAStartPage: the README is the start page, at most 300 lines; docs/ holds the
// rest by topic, each page linked from it.
func TestReadmeIsAStartPage(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(readme), "\n"); n > 300 {
		t.Errorf("the README is %d lines, over 300", n)
	}
	pages, _ := filepath.Glob("docs/*.md")
	for _, p := range pages {
		if !strings.Contains(string(readme), "("+p+")") {
			t.Errorf("the README does not link %s", p)
		}
	}
}

// TestDocsLinksResolve: every relative link of the README and of the pages under docs/
// names a file of the repository, and its #anchor a heading of that page (as GitHub makes
// an anchor of a heading); no page sends a reader outside the repository for its own rules.
func TestDocsLinksResolve(t *testing.T) {
	t.Parallel()
	anchors := func(text string) map[string]bool {
		set := map[string]bool{}
		for _, h := range regexp.MustCompile(`(?m)^#+ (.*)$`).FindAllStringSubmatch(text, -1) {
			slug := strings.Map(func(r rune) rune {
				switch {
				case r == ' ':
					return '-'
				case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
					return unicode.ToLower(r)
				}
				return -1
			}, h[1])
			set[slug] = true
		}
		return set
	}
	texts := map[string]string{}
	for _, p := range docPages(t) {
		texts[p.name] = p.text
	}
	checked := 0
	for name, text := range texts {
		for _, m := range regexp.MustCompile(`\]\(([^)\s]+)\)`).FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			checked++
			file, anchor, _ := strings.Cut(target, "#")
			path := name
			if file != "" {
				path = filepath.Clean(filepath.Join(filepath.Dir(name), file))
			}
			body, ok := texts[path]
			if !ok {
				b, err := os.ReadFile(path)
				if err != nil {
					t.Errorf("%s links %s: %v", name, target, err)
					continue
				}
				body = string(b)
			}
			if anchor != "" && !anchors(body)[anchor] {
				t.Errorf("%s links %s: %s has no heading whose anchor is #%s", name, target, path, anchor)
			}
		}
		if strings.Contains(text, "SPEC.md") || strings.Contains(text, "CONTRACT.md") || strings.Contains(text, "../shared") {
			t.Errorf("%s refers to files a clone of the repository does not have", name)
		}
	}
	if checked < 40 {
		t.Errorf("only %d relative links checked", checked)
	}
}

// TestDocsShellBlocksAsAReaderRunsThem: in every shell block of the README and docs/, each npx
// says --yes (npm set yes=false otherwise stops to ask, and a script waits for ever), and a
// block that shows the answers of two curls or more on the terminal ends each with a newline
// (-w '\n'), so that each answer is a line of its own.
func TestDocsShellBlocksAsAReaderRunsThem(t *testing.T) {
	t.Parallel()
	npx, shown := 0, 0
	for _, p := range docPages(t) {
		for i, b := range shellBlocks(p.text) {
			var bare []string // curls whose answer reaches the terminal without a newline of their own
			for _, line := range strings.Split(b[1], "\n") {
				cmd, _, _ := strings.Cut(line, " #")
				for _, m := range regexp.MustCompile(`npx(\s+\S+)?`).FindAllStringSubmatch(cmd, -1) {
					npx++
					if strings.TrimSpace(m[1]) != "--yes" {
						t.Errorf("%s shell block %d runs npx without --yes:\n%s", p.name, i, line)
					}
				}
				if c := strings.TrimSpace(cmd); strings.HasPrefix(c, "curl ") && !strings.Contains(c, "|") && !strings.Contains(c, " -o ") && !strings.Contains(c, " -w ") && !strings.Contains(c, " > ") {
					bare = append(bare, line)
				}
			}
			shown += len(bare)
			if len(bare) > 1 {
				t.Errorf("%s shell block %d shows %d answers without a newline after each (add -w '\\n'):\n%s", p.name, i, len(bare), strings.Join(bare, "\n"))
			}
		}
	}
	if npx == 0 || shown == 0 {
		t.Errorf("%d npx commands and %d curls shown found: the check checks nothing", npx, shown)
	}
}

// TestClientsPageRunsInOneShell: the shell blocks of docs/clients-and-test-suites.md, run in
// the order the page gives them, in one shell, where a reader runs them (a folder holding the
// repository's openapi.json), against a sandbox (the block that starts one is the sandbox
// the test serves). The tools the page fetches from the network (npx, Schemathesis, go run of
// oapi-codegen) are stand-ins that check what a real one needs and fail as it would: npx
// without --yes, a file it reads missing from the folder it runs in, an address that does
// not answer. A block that left the shell in another folder, or an npx that would stop to
// ask, fails here. The page's tools themselves are run against the sandbox by hand (the
// development notes say how).
func TestClientsPageRunsInOneShell(t *testing.T) {
	t.Parallel()
	needTools(t, "bash", "curl", "go")
	page, err := os.ReadFile("docs/clients-and-test-suites.md")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, envOptions{rate: -1, quiet: true})
	ts := httptest.NewServer(e.h)
	defer ts.Close()
	realGo, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	dir, bin := t.TempDir(), t.TempDir()
	doc, err := os.ReadFile("openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "openapi.json"), doc, 0o644); err != nil {
		t.Fatal(err)
	}
	// Each stand-in: every argument that names a local file must name one in the folder it
	// runs in, every URL must answer, and npx must say --yes.
	check := `for a in "$@"; do
  case "$a" in
    http://*) curl -s -o /dev/null "$a" || { echo "$0: $a does not answer" >&2; exit 1; } ;;
    *.json) [ -f "$a" ] || [ -f "${a#*=}" ] || { echo "$0: no $a in $PWD" >&2; exit 1; } ;;
  esac
done
`
	stubs := map[string]string{
		"npx":          "#!/usr/bin/env bash\n[ \"$1\" = --yes ] || { echo 'npx: Need to install the following packages. Ok to proceed? (y) (npm yes=false: no)' >&2; exit 1; }\n" + check,
		"schemathesis": "#!/usr/bin/env bash\n" + check,
		"go":           "#!/usr/bin/env bash\nif [ \"$1\" = run ] && [[ \"$2\" == github.com/* ]]; then\n" + check + "  echo 'package sandbox'; exit 0\nfi\nexec " + shellQuote(realGo) + ` "$@"` + "\n",
	}
	for name, text := range stubs {
		if err := os.WriteFile(filepath.Join(bin, name), []byte(text), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var script strings.Builder
	script.WriteString("set -euo pipefail\n")
	blocks := 0
	for _, b := range shellBlocks(string(page)) {
		if strings.TrimSpace(b[1]) == "go run . -rate 0" { // the sandbox: the one this test serves
			continue
		}
		blocks++
		script.WriteString(strings.ReplaceAll(b[1], "http://127.0.0.1:8080", ts.URL) + "\n")
	}
	sh := exec.Command("bash", "-c", script.String())
	sh.Dir = dir
	sh.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"), "GOFLAGS=", "GOTOOLCHAIN=local", "TMPDIR="+t.TempDir())
	if out, err := sh.CombinedOutput(); err != nil || blocks < 5 {
		t.Errorf("the page's %d blocks, in order in one shell: %v\n%s", blocks, err, out)
	}
}

// TestDocsSendJSONBodiesAsJSON: every curl in the README and docs/ that sends a body says
// Content-Type: application/json, as the document requires (curl -d alone sends a form,
// which a validating proxy refuses).
func TestDocsSendJSONBodiesAsJSON(t *testing.T) {
	t.Parallel()
	sent := 0
	for _, p := range docPages(t) {
		for _, line := range strings.Split(p.text, "\n") {
			if !strings.Contains(line, "curl") || !regexp.MustCompile(`\s(-d|--data[a-z-]*)[\s=]`).MatchString(line) {
				continue
			}
			sent++
			if !strings.Contains(line, "Content-Type: application/json") {
				t.Errorf("%s sends a body without Content-Type: application/json:\n%s", p.name, line)
			}
		}
	}
	if sent == 0 {
		t.Error("no curl that sends a body found: the check checks nothing")
	}
}

// TestDocsGoSetup: the two Go blocks of docs/sandboxes.md, each a whole file compiled as
// written in a module of its own with a test beside it. The setup: 12 tests at once, each
// making a copy of acct_sync with one key against a sandbox whose limit is 2 a second, meet
// the limit, wait its 429s out and pass, and each sandbox is forgotten after its test;
// unset, SANDBOX_URL names the base URL go run . serves. The TestMain: it builds this
// repository (SANDBOX_SRC), serves it on a free loopback port, gives each test a sandbox of
// its own there, and stops it.
func TestDocsGoSetup(t *testing.T) {
	t.Parallel()
	page, err := os.ReadFile("docs/sandboxes.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```go\n(.*?)```").FindAllSubmatch(page, -1)
	if len(blocks) != 2 {
		t.Fatalf("%d Go blocks in docs/sandboxes.md, want the setup and the TestMain", len(blocks))
	}
	setup, testMain := string(blocks[0][1]), string(blocks[1][1])
	if !strings.HasPrefix(setup, "package yourpackage\n") || !strings.Contains(setup, `return "`+defaultBaseURL+`"`) || !strings.HasPrefix(testMain, "package yourpackage\n") {
		t.Fatalf("the blocks are not whole files, or the setup does not default to %s:\n%s", defaultBaseURL, setup)
	}
	const tests = 12
	var parallel strings.Builder
	for i := range tests {
		fmt.Fprintf(&parallel, "func TestSandbox%d(t *testing.T) { t.Parallel(); base, key := newSandbox(t); readAnOrder(t, base, key) }\n", i)
	}
	readAnOrder := `
func readAnOrder(t *testing.T, base, key string) {
	req, _ := http.NewRequest(http.MethodGet, base+"/orders/ord_sync_0001", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := http.DefaultClient.Do(req)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("GET with the sandbox's key: %v %v", res, err)
	}
	res.Body.Close()
}
`
	goTest := func(t *testing.T, files map[string]string, env ...string) string {
		dir := t.TempDir()
		files["go.mod"] = "module setup\n\ngo 1.24\n"
		for name, text := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		cmd := exec.Command("go", "test", "-count=1", "-v", ".")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), append(env, "GOFLAGS=")...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go test of the page's block: %v\n%s", err, out)
		}
		return string(out)
	}
	t.Run("the setup waits out the rate limit", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, envOptions{rate: 2, wall: true})
		ts := httptest.NewServer(e.h)
		defer ts.Close()
		goTest(t, map[string]string{"setup_test.go": setup, "sandbox_test.go": "package yourpackage\n\nimport (\n\t\"net/http\"\n\t\"testing\"\n)\n" + readAnOrder + parallel.String()},
			"SANDBOX_URL="+ts.URL+"/v1")
		if n := e.srv.registry.count(e.srv.now()); n != 0 {
			t.Errorf("%d sandboxes left after the tests: the setup's cleanup did not forget them", n)
		}
		read := e.get(t, "/v1/test_helpers/requests", "sk_test_sync_all")
		for read.status == 429 { // the tests drained the key's bucket: wait it out, as they did
			time.Sleep(time.Second)
			read = e.get(t, "/v1/test_helpers/requests", "sk_test_sync_all")
		}
		var j requestsOut
		strict(t, read, &j)
		made, limited := 0, 0
		for _, entry := range j.Data {
			switch entry.Status {
			case 201:
				made++
			case 429:
				limited++
			}
		}
		if made != tests || limited == 0 {
			t.Errorf("acct_sync's journal holds %d sandboxes made and %d 429s, want %d made after some 429s", made, limited, tests)
		}
	})
	t.Run("the TestMain serves a sandbox of its own", func(t *testing.T) {
		t.Parallel()
		repo, err := os.Getwd()
		if err != nil {
			t.Fatal(err)
		}
		out := goTest(t, map[string]string{"setup_test.go": setup, "main_test.go": testMain,
			"sandbox_test.go": "package yourpackage\n\nimport (\n\t\"net/http\"\n\t\"testing\"\n)\n" + readAnOrder + parallel.String()[:strings.Index(parallel.String(), "func TestSandbox2")]},
			"SANDBOX_SRC="+repo, "SANDBOX_URL=")
		if strings.Count(out, "--- PASS: TestSandbox") != 2 {
			t.Errorf("the tests under the TestMain:\n%s", out)
		}
	})
}

// TestReadmeSyncReadsEveryTimestamp: the README's two order syncs print what it shows also
// when the API writes timestamps with a fraction of a second (a start instant of
// 12:00:19.5 makes every acct_sync instant one): they compare instants, not strings, and
// step with Prefer clock offsets rather than date arithmetic.
func TestReadmeSyncReadsEveryTimestamp(t *testing.T) {
	t.Parallel()
	needTools(t, "bash", "curl", "jq")
	e := newEnv(t, envOptions{rate: -1, start: time.Date(2026, 11, 22, 12, 0, 19, 5e8, time.UTC)})
	ts := httptest.NewServer(e.h)
	defer ts.Close()
	var blocks [][]string
	for _, p := range docPages(t) {
		blocks = append(blocks, shellBlocks(p.text)...)
	}
	ran := 0
	for _, b := range blocks {
		if !strings.Contains(b[1], "sk_test_sync_all") || !strings.Contains(b[1], "created_from") {
			continue
		}
		ran++
		out, err := exec.Command("bash", "-c", "set -euo pipefail\nB="+ts.URL+"/v1\n"+b[1]).Output()
		if got := strings.TrimSuffix(string(out), "\n"); err != nil || got != b[2] {
			t.Errorf("a README sync over fractional timestamps printed (%v)\n%s\nthe README shows\n%s", err, got, b[2])
		}
	}
	if ran != 2 {
		t.Errorf("%d README syncs found, want the watermark and the look-back ones", ran)
	}
}

// TestReadmeDatasetExample: the example dataset of docs/datasets.md loads.
func TestReadmeDatasetExample(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("docs/datasets.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```json\n(\\{\n  \"accounts\".*?)```").FindStringSubmatch(string(readme))
	if m == nil {
		t.Fatal("no example dataset in the README")
	}
	sb, err := loadBytes("README.md", []byte(m[1]), 0, testNow, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if s := sb.tenants.byID[tenantID{"acct_acme", "test"}].current().shipments.find("shp_acme_1"); s == nil || len(s.instants) != 2 {
		t.Errorf("the README's example shipment did not load with its two events")
	}
}

// TestContainerImage: the Containerfile is FROM scratch, runs as nobody (65534:65534), and
// holds the binary its comment
// says to build (CGO_ENABLED=0 go build -trimpath -o sandbox .), which is static (a scratch
// image has no loader or libraries), and runs as the image runs it: its ENTRYPOINT with
// the image's ENV alone, in an empty folder, listening on every interface and saying so;
// SIGTERM (what podman and docker stop send) drains it and it exits 0; its MCP door answers,
// and its mcp command carries a message over stdio. Building and running the image itself
// needs podman or docker, which go test does not assume.
func TestContainerImage(t *testing.T) {
	t.Parallel()
	text, err := os.ReadFile("Containerfile")
	if err != nil {
		t.Fatal(err)
	}
	var instructions []string
	env := []string{}
	for _, line := range strings.Split(string(text), "\n") {
		if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		instructions = append(instructions, line)
		if v, ok := strings.CutPrefix(line, "ENV "); ok {
			env = append(env, v)
		}
	}
	if want := []string{"FROM scratch", "COPY sandbox /sandbox", "ENV SANDBOX_ADDR=0.0.0.0:8080", "EXPOSE 8080", "USER 65534:65534", `ENTRYPOINT ["/sandbox"]`}; !slices.Equal(instructions, want) {
		t.Fatalf("the Containerfile's instructions:\n%s\nwant\n%s", strings.Join(instructions, "\n"), strings.Join(want, "\n"))
	}
	build := regexp.MustCompile(`(?m)^#\s+(CGO_ENABLED=0 go build .*)$`).FindStringSubmatch(string(text))
	if build == nil {
		t.Fatal("the Containerfile does not say how to build the binary it holds")
	}
	// The binary runs as the image runs it: as nobody, when the test may change its user
	// (as root), else as the test's own user, who is not root either.
	dir, err := os.MkdirTemp("", "image-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil { // nobody reaches the binary in it
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "-c", strings.Replace(build[1], "-o sandbox", "-o "+dir+"/sandbox", 1))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", build[1], err, out)
	}
	bin, err := elf.Open(dir + "/sandbox")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range bin.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("the binary is linked dynamically (%v): a scratch image cannot run it", p.Type)
		}
	}
	bin.Close()
	port := strings.TrimPrefix(regexp.MustCompile(`:\d+$`).FindString(func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().String()
	}()), ":")
	empty := dir + "/empty" // its working directory: nothing in it
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	image := exec.Command(dir + "/sandbox")
	image.Dir = empty
	if os.Getuid() == 0 {
		image.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	}
	image.Env = []string{strings.Replace(env[0], ":8080", ":"+port, 1)} // the image's ENV, on a free port
	stdout, stderr := &lockedBuffer{}, &lockedBuffer{}
	image.Stdout, image.Stderr = stdout, stderr
	if err := image.Start(); err != nil {
		t.Fatal(err)
	}
	defer image.Process.Kill()
	waitFor(t, "the image's sandbox to print its keys", func() bool { return strings.Contains(stdout.String(), "sk_test_sandbox_all") })
	if proc, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", image.Process.Pid)); err == nil && regexp.MustCompile(`(?m)^Uid:\s+0\s`).Match(proc) {
		t.Errorf("the image's sandbox runs as root:\n%s", proc)
	}
	for _, want := range []string{"Listening on every network interface (SANDBOX_ADDR 0.0.0.0:" + port + ")", "http://127.0.0.1:" + port + "/v1",
		"In a browser: http://127.0.0.1:" + port + "/ shows the fixtures and what moves", "The landing page does not show the keys."} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("the image's banner lacks %q:\n%s", want, stdout.String())
		}
	}
	if strings.Contains(stdout.String(), "shows the keys") { // the page shows none: the banner says so, and only so
		t.Errorf("the image's banner says the page shows the keys, which it does not:\n%s", stdout.String())
	}
	if status, body := httpGet(t, "http://127.0.0.1:"+port+"/v1/healthz", ""); status != 200 || body != `{"status":"ok"}` {
		t.Errorf("GET /v1/healthz of the image's sandbox = %d %s", status, body)
	}
	if status, _ := httpGet(t, "http://127.0.0.1:"+port+"/v1/orders", "Bearer sk_test_sandbox_all"); status != 200 {
		t.Errorf("GET /v1/orders of the image's sandbox = %d", status)
	}
	// The MCP door of the image's sandbox: every interface, so any Host; a key, as ever.
	door, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1:"+port+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_clock","arguments":{}}}`))
	door.Host = "sandbox.lan:" + port
	door.Header.Set("Authorization", "Bearer sk_test_sandbox_all")
	door.Header.Set("Content-Type", "application/json")
	if res, err := http.DefaultClient.Do(door); err != nil || res.StatusCode != 200 {
		t.Errorf("POST /mcp of the image's sandbox: %v %v", err, res)
	} else {
		res.Body.Close()
	}
	image.Process.Signal(syscall.SIGTERM)
	if _, status := waitExit(t, image, time.Now(), 15*time.Second); status != 0 {
		t.Errorf("SIGTERM: exit status %d, want 0\n%s", status, stderr.String())
	}
	// podman run -i IMAGE mcp: the door over stdio, the image's ENV and all.
	stdio := exec.Command(dir+"/sandbox", "mcp")
	stdio.Dir, stdio.Env, stdio.SysProcAttr = empty, image.Env, image.SysProcAttr
	stdio.Stdin = strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}` + "\n")
	if out, err := stdio.Output(); err != nil || string(out) != `{"jsonrpc":"2.0","id":1,"result":{}}`+"\n" {
		t.Errorf("the image's binary, mcp: %v %q", err, out)
	}
}

// TestLandingPage: GET / (that exact path) is a small HTML page with the base URL, the keys
// (only to a loopback Host on loopback), each tenant's keys, shipments and orders as its
// clock shows them, and links, all at the address the browser used.
func TestLandingPage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{seed: 50, step: -1, rate: -1})
	rep := e.get(t, "/", "")
	page := string(rep.body)
	if rep.status != 200 || rep.header.Get("Content-Type") != "text/html; charset=utf-8" {
		t.Fatalf("GET / = %d %s, want 200 text/html; charset=utf-8", rep.status, rep.header.Get("Content-Type"))
	}
	for _, want := range []string{
		`<link rel="icon" href="data:,">`, "<code>http://127.0.0.1:8080/v1</code>", `href="http://127.0.0.1:8080/v1/openapi.json"`, `href="http://127.0.0.1:8080/healthz"`,
		"the MCP door is <code>POST http://127.0.0.1:8080/mcp</code>", "<code>go run . mcp</code> over stdio",
		"curl -s -H &#39;Authorization: Bearer sk_test_sandbox_all&#39; http://127.0.0.1:8080/v1/orders",
		"<tr><td>sk_test_sandbox_expired<td>tracking:read orders:read<td>expired 2026-01-01T00:00:00Z\n",
		"<tr><td>sk_live_sandbox_all<td>", "<tr><td>shp_sbx_spring<td>SBX1000000001<td>delivered\n",
		"<tr><td>shp_sbx_twin_a<td>SBX2000000000<td>in_transit<td>shared number \n",
		"<tr><td>shp_sbx_naive<td>SBX1000000003<td>in_transit<td>3 dropped\n",
		"<th>Notes\n", "Started at 2026-11-22T12:00:00Z.",
		`Accounts and environments: <a href="#t0">acct_sandbox/test</a> <a href="#t1">acct_sandbox/live</a> <a href="#t2">acct_sync/test</a> <a href="#t3">acct_other/test</a></p>`,
		`<h2 id="t2">acct_sync/test</h2>`,
		"<tr><td>shp_sbx_unlabelled<td><span class=\"n\">none</span>", "and 31 more orders",
		"<tr><td>ord_other_0001<td>fulfilled<td>2026-10-14T09:00:00Z\n",
		"As its sandbox clock shows it: 2026-11-22T12:00:00Z (+0s).</p>",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if strings.Contains(page, "<script") || strings.Contains(page, "src=") || strings.Index(page, ">acct_sandbox/test</h2>") > strings.Index(page, ">acct_sandbox/live</h2>") ||
		strings.Index(page, ">acct_sandbox/live</h2>") > strings.Index(page, ">acct_other/test</h2>") {
		t.Error("the page has a script or an external asset, or its tenants are not the first key's, then the dataset's order")
	}
	// The clock: a shipment's status and the orders as the tenant's clock shows them.
	e.setClock(t, "sk_test_sandbox_all", "2026-03-29T01:30:00Z")
	page = string(e.get(t, "/", "").body)
	if !strings.Contains(page, "<tr><td>shp_sbx_spring<td>SBX1000000001<td>in_transit\n") || !strings.Contains(page, "None yet.") ||
		!strings.Contains(page, "As its sandbox clock shows it: 2026-03-29T01:30:00Z (-5722h30m0s), frozen.") {
		t.Error("the page does not follow the tenant's clock")
	}
	// The keys only to a loopback Host: a page reached under another name (DNS rebinding)
	// shows none; the links name the Host the browser used.
	for _, tt := range []struct {
		host    string
		keys    bool
		baseURL string
	}{
		{"127.0.0.1:8080", true, "http://127.0.0.1:8080/v1"},
		{"LOCALHOST:9999", true, "http://localhost:9999/v1"},
		{"127.0.0.2", true, "http://127.0.0.2/v1"},
		{"[::1]:8080", true, "http://[::1]:8080/v1"},
		{"attacker.example", false, "http://attacker.example/v1"},
		{"attacker.example:8080", false, "http://attacker.example:8080/v1"},
		{"192.0.2.2:19183", false, "http://192.0.2.2:19183/v1"},
		{"localhost.attacker.example", false, "http://localhost.attacker.example/v1"},
		{"bad host", false, "http://127.0.0.1:8080/v1"},
	} {
		r := newRequest(http.MethodGet, "/", "")
		r.Host = tt.host
		page := string(e.do(t, r).body)
		if strings.Contains(page, "sk_test_") != tt.keys || !strings.Contains(page, "Base URL: <code>"+tt.baseURL+"</code>") || !strings.Contains(page, `href="`+tt.baseURL+`/openapi.json"`) {
			t.Errorf("Host %q: keys shown %v, want %v; want the base URL %s", tt.host, strings.Contains(page, "sk_test_"), tt.keys, tt.baseURL)
		}
	}
	// Listening where others reach it: no key on the page, whatever the Host.
	remote := newEnv(t, envOptions{remote: true})
	if page := string(remote.get(t, "/", "").body); strings.Contains(page, "sk_test_") || strings.Contains(page, "curl") {
		t.Error("the page shows keys while the sandbox is not on loopback")
	}
	// Only the exact path.
	wantProblem(t, e.get(t, "/index.html", ""), 404, "route_not_found", "")
}

// pageDataset is a dataset of tenants accounts, each with keys keys, shipments shipments
// and orders orders, every id of width bytes made of fill, and every shown value as long as
// it can be: keys that expire at an instant with nanoseconds, shipments that share their
// tracking number in pairs and drop an event, orders imported and shipments' events
// scheduled half before the start (at it, for an event) and half after.
func pageDataset(tenants, keys, shipments, orders, width int, fill string) []byte {
	id := func(prefix string, i int) string {
		s := fmt.Sprintf("%s%d", prefix, i)
		return s + strings.Repeat(fill, max(0, width-len(s)))
	}
	q := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	var as, ks, ss, os []string
	for a := range tenants {
		acct := id("a", a)[:max(1, width-len("/test"))]
		as = append(as, `{"id":`+q(acct)+`,"environments":["test"]}`)
		for k := range keys {
			key := strings.NewReplacer("&", "+", `"`, "+").Replace(id(fmt.Sprintf("k%d_", a), k)) // a key is a Bearer credential
			ks = append(ks, `{"key":`+q(key)+`,"account":`+q(acct)+`,"environment":"test","scopes":["tracking:read","orders:read"],"expires_at":"2099-12-31T23:59:59.123456789Z"}`)
		}
		for o := range orders { // offsets as long as they are written: +2000000h59m10.123456789s
			imported := fmt.Sprintf("start+2000000h59m%d.123456789s", 10+o)
			if o < orders/2 {
				imported = fmt.Sprintf("start-2000000h59m%d.123456789s", 10+o)
			}
			os = append(os, `{"id":`+q(id(fmt.Sprintf("o%d_", a), o))+`,"account":`+q(acct)+`,"environment":"test","merchant_reference":"R","platform":"ebay","status":"partially_fulfilled",`+
				`"created_at":"start-2000001h0.123456789s","imported_at":"`+imported+`"}`)
		}
		for s := range shipments {
			after := fmt.Sprintf("-2000000h59m%d.123456789s", 10+s)
			if s >= shipments/2 {
				after = fmt.Sprintf("2000000h59m%d.123456789s", 10+s)
			}
			ss = append(ss, `{"id":`+q(id(fmt.Sprintf("s%d_", a), s))+`,"account":`+q(acct)+`,"environment":"test","reference":"R","tracking_number":`+q(id(fmt.Sprintf("t%d_", a), s/2))+
				`,"events":[{"after":"`+after+`","status":"available_for_pickup","description":`+q(id("d", s))+`},{"timestamp":"no offset","status":"in_transit","description":"x"}]}`)
		}
	}
	return []byte(dataset(strings.Join(as, ","), strings.Join(ks, ","), strings.Join(ss, ","), strings.Join(os, ",")))
}

// TestLandingPageIsBounded: whatever the dataset, the page shows at most 20 tenants, and of
// each at most 20 keys, shipments and orders, then how many more; a value over 64 bytes is
// cut to 61 and "..."; the page is at most 256 KiB when every value is under 64 bytes,
// 1 MiB whatever the values, and each shown tenant's last 5 journal entries add at most
// 24 KiB. (BenchmarkLandingPage shows its cost with 100,000 shipments
// and 40,000 tenants.)
func TestLandingPageIsBounded(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name                             string
		tenants, keys, shipments, orders int
		width                            int
		fill                             string
		limit                            int
		want                             []string
	}{
		{"10,000 shipments", 1, 1, 10000, 1, 12, "x", 256 << 10, []string{"and 9,980 more shipments"}},
		{"4,000 tenants", 4000, 1, 1, 1, 12, "x", 256 << 10, []string{"and 3,980 more accounts and environments"}},
		{"values of 63 bytes", 25, 25, 25, 50, 63, "x", 256 << 10, []string{"and 5 more keys", "and 5 more shipments", "and 5 more orders", "and 5 more accounts", "and 27 more before", "and 28 more to come"}},
		{"values of 63 bytes of +", 25, 25, 25, 50, 63, "+", 256 << 10, []string{"and 5 more keys"}},
		{"values of 63 bytes of &", 25, 25, 25, 50, 63, "&", 256 << 10, []string{"&amp;&amp;..."}},
		{`values of 63 bytes of "`, 25, 25, 25, 50, 63, `"`, 256 << 10, []string{"&#34;&#34;..."}},
		{"values of 255 bytes to escape", 25, 25, 25, 50, 255, "&", 1 << 20, []string{"&amp;&amp;..."}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, envOptions{data: pageDataset(tt.tenants, tt.keys, tt.shipments, tt.orders, tt.width, tt.fill), quiet: true})
			quiet := len(e.get(t, "/", "").body)
			// Each shown tenant's clock running, and its last 5 entries of targets that
			// take the most written: the journal's rows add at most 24 KiB.
			shown := map[tenantID]bool{}
			for _, k := range e.sb.keyLines {
				if shown[k.tenant] || len(shown) == 20 {
					continue
				}
				shown[k.tenant] = true
				e.do(t, newBodyRequest(http.MethodPost, "/v1/test_helpers/clock", k.key, `{"run_from":"start"}`))
				for i := range 5 {
					e.get(t, "/v1/orders?"+strings.Repeat("&", 300)+strconv.Itoa(i), k.key)
				}
			}
			page := string(e.get(t, "/", "").body)
			t.Logf("%d bytes, %d with the journal's rows and running clocks", quiet, len(page))
			if len(page) > tt.limit+24<<10 || len(page)-quiet > 24<<10 {
				t.Errorf("the page is %d bytes (%d before the journal's rows), want at most %d and 24 KiB more", len(page), quiet, tt.limit)
			}
			if !strings.Contains(page, "running from") || strings.Count(page, "<h3>Requests</h3>") != min(tt.tenants, 20) {
				t.Error("the page does not show the running clocks and the journals")
			}
			if n := strings.Count(page, "<h2 id="); n != min(tt.tenants, 20) {
				t.Errorf("%d tenants shown, want %d", n, min(tt.tenants, 20))
			}
			for _, want := range tt.want {
				if !strings.Contains(page, want) {
					t.Errorf("the page lacks %q", want)
				}
			}
			for _, cell := range regexp.MustCompile(`<td>([^<\n]*)`).FindAllStringSubmatch(page, -1) {
				if len(cell[1]) > 64 && !strings.HasPrefix(cell[1], "shared number") {
					t.Fatalf("a shown value written in %d bytes: %q", len(cell[1]), cell[1])
				}
			}
		})
	}
}

// tenantOnPage is the section of the landing page about the tenant named name.
func tenantOnPage(t *testing.T, page, name string) string {
	t.Helper()
	i := strings.Index(page, ">"+name+"</h2>")
	if i < 0 {
		t.Fatalf("the page has no section for %s", name)
	}
	section := page[i:]
	if end := strings.Index(section[1:], "<h2 "); end >= 0 {
		section = section[:end+1]
	}
	return section
}

// timelineOnPage is the tenant's timeline on the landing page, split at its clock: what is
// shown, and what is to come.
func timelineOnPage(t *testing.T, page, name string) (shown, toCome string) {
	t.Helper()
	section := tenantOnPage(t, page, name)
	i := strings.Index(section, "<h3>Timeline</h3>")
	if i < 0 {
		t.Fatalf("%s's section has no timeline", name)
	}
	shown, toCome, ok := strings.Cut(section[i:], `<tr><td class="n" colspan="3">now (`)
	if !ok {
		t.Fatalf("%s's timeline does not mark its clock", name)
	}
	return shown, toCome
}

// TestLandingPageShowsTimelines: each tenant's timeline, the last 10 happenings at or
// before its clock marked shown and the next 10 marked to come, with how many more.
func TestLandingPageShowsTimelines(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, step: -1})
	past, future := timelineOnPage(t, string(e.get(t, "/", "").body), "acct_sync/test")
	for _, want := range []string{
		"<tr><td>-10m0s<td>ord_sync_0001<td>imported, unfulfilled\n",
		"<tr><td>-1m0s<td>ord_sync_0005<td>imported, unfulfilled\n",
	} {
		if !strings.Contains(past, want) {
			t.Errorf("acct_sync's timeline shows no %q", want)
		}
	}
	for _, want := range []string{
		"<tr><td>+30s<td>ord_sync_0005<td>now cancelled\n",
		"<tr><td>+1m0s<td>shp_sync_1<td>created\n<tr><td>+1m0s<td>ord_sync_0001<td>now partially_fulfilled\n<tr><td>+1m0s<td>shp_sync_1<td>tracking: pre_transit\n",
		"<tr><td>+1m30s<td>ord_sync_0002<td>imported, unfulfilled\n",
	} {
		if !strings.Contains(future, want) {
			t.Errorf("acct_sync's timeline has not %q to come", want)
		}
	}
	sync := tenantOnPage(t, string(e.get(t, "/", "").body), "acct_sync/test")
	if !strings.Contains(sync, "<tr><td>ord_sync_0005<td>unfulfilled<td>2026-11-22T11:59:00Z\n") {
		t.Error("acct_sync's orders lack ord_sync_0005 as it stands")
	}
	if strings.Contains(sync, "ord_sync_0002<td>unfulfilled") || strings.Contains(sync, "<td>shp_sync_1<td>SYNC") {
		t.Error("the page shows an order not imported yet, or a shipment not created yet")
	}
	// Moved on: everything shown; the shipment found and the link shown.
	e.setClock(t, "sk_test_sync_all", "2026-11-22T12:02:00Z")
	page := string(e.get(t, "/", "").body)
	sync = tenantOnPage(t, page, "acct_sync/test")
	past, future = timelineOnPage(t, page, "acct_sync/test")
	for _, want := range []string{"<tr><td>shp_sync_1<td>SYNC1000000001<td>in_transit\n", "<tr><td>ord_sync_0001<td>fulfilled<td>2026-11-22T11:50:00Z\n",
		"and 2 more before", "<tr><td>+2m0s<td>ord_sync_0001<td>now fulfilled\n"} {
		if !strings.Contains(sync, want) || strings.Contains(want, "<td>+2m") && !strings.Contains(past, want) {
			t.Errorf("acct_sync's section at +2m lacks %q", want)
		}
	}
	if strings.Contains(future, "<tr><td>+") {
		t.Errorf("at +2m something of acct_sync is still to come: %s", future)
	}
	// A long timeline: 10 each side, then counts.
	var orders []string
	for i := range 50 {
		imported := fmt.Sprintf("start+%dm", i-20)
		if i < 20 {
			imported = fmt.Sprintf("start-%dm", 20-i)
		}
		orders = append(orders, fmt.Sprintf(`{"id":"ord_%02d","account":"acct_a","environment":"test","merchant_reference":"R","platform":"ebay","status":"unfulfilled","created_at":"start-100m","imported_at":%q}`, i, imported))
	}
	long := newEnv(t, envOptions{data: []byte(dataset(dsAccounts, dsKey, "", strings.Join(orders, ","))), rate: -1, step: -1})
	past, future = timelineOnPage(t, string(long.get(t, "/", "").body), "acct_a/test")
	if n, m := strings.Count(past, "<tr><td>"), strings.Count(future, "<tr><td>"); n != 10 || m != 10 || !strings.Contains(past, "and 11 more before") || !strings.Contains(future, "and 19 more to come") {
		t.Errorf("a timeline of 50 imports, 21 of them shown: the page shows %d and %d to come", n, m)
	}
}

// TestCORS: with -cors-origin every answer under /v1 and /healthz, errors included, lets that
// origin read it; a preflight on a known path is answered before any key; without the flag
// no CORS header is sent and OPTIONS is 405.
func TestCORS(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{cors: "http://localhost:3000"})
	for _, tt := range []struct {
		target, key string
		status      int
		cors        bool
	}{
		{"/v1/orders", "sk_test_sandbox_all", 200, true},
		{"/v1/orders", "", 401, true},
		{"/v1/nope", "", 404, true},
		{"/healthz", "", 200, true},
		{"/", "", 200, false},
		{"/nope", "", 404, false},
	} {
		rep := e.get(t, tt.target, tt.key, "Origin", "http://elsewhere.test")
		got := rep.header.Get("Access-Control-Allow-Origin")
		if rep.status != tt.status || (got == "http://localhost:3000") != tt.cors {
			t.Errorf("GET %s = %d with Access-Control-Allow-Origin %q; want %d, CORS %v", tt.target, rep.status, got, tt.status, tt.cors)
		}
		if tt.cors && (rep.header.Get("Vary") != "Origin" || rep.header.Get("Access-Control-Expose-Headers") != "Request-Id, RateLimit, RateLimit-Policy, Retry-After, Preference-Applied, WWW-Authenticate, Location, Idempotent-Replayed") {
			t.Errorf("GET %s: Vary %q, Expose-Headers %q", tt.target, rep.header.Get("Vary"), rep.header.Get("Access-Control-Expose-Headers"))
		}
	}
	preflight := func(env *env, target string) reply {
		return env.do(t, newRequest(http.MethodOptions, target, "", "Origin", "http://localhost:3000", "Access-Control-Request-Method", "POST", "Access-Control-Request-Headers", "authorization, prefer"))
	}
	rep := preflight(e, "/v1/test_helpers/clock")
	if rep.status != 204 || rep.header.Get("Access-Control-Allow-Methods") != "GET, HEAD, POST" || rep.header.Get("Access-Control-Allow-Headers") != "authorization, prefer" ||
		rep.header.Get("Access-Control-Max-Age") != "600" || rep.header.Get("Access-Control-Allow-Origin") != "http://localhost:3000" {
		t.Errorf("preflight = %d %v, want 204 with the CORS headers", rep.status, rep.header)
	}
	wantProblem(t, preflight(e, "/v1/nope"), 404, "route_not_found", "")
	wantProblem(t, e.do(t, newRequest(http.MethodOptions, "/v1/orders", "")), 405, "method_not_allowed", "") // not a preflight
	// The page is no API: a preflight there is a 405 like any OPTIONS, without CORS.
	rep = preflight(e, "/")
	wantProblem(t, rep, 405, "method_not_allowed", "")
	if rep.header.Get("Access-Control-Allow-Origin") != "" || rep.header.Get("Access-Control-Allow-Methods") != "" {
		t.Errorf("a preflight on / got CORS headers: %v", rep.header)
	}
	// Without the flag a preflight is 405, and its detail names the flag (not on /).
	off := newEnv(t, envOptions{})
	if p := wantProblem(t, preflight(off, "/v1/orders"), 405, "method_not_allowed", ""); !strings.Contains(p.Detail, "-cors-origin") {
		t.Errorf("a preflight without -cors-origin: detail %q does not name the flag", p.Detail)
	}
	if p := wantProblem(t, preflight(off, "/"), 405, "method_not_allowed", ""); strings.Contains(p.Detail, "-cors-origin") {
		t.Errorf("a preflight on the page: detail %q names the flag", p.Detail)
	}
	if p := wantProblem(t, off.do(t, newRequest(http.MethodOptions, "/v1/orders", "")), 405, "method_not_allowed", ""); strings.Contains(p.Detail, "-cors-origin") {
		t.Errorf("an OPTIONS that is no preflight: detail %q names the flag", p.Detail)
	}
	if rep := off.get(t, "/v1/orders", "sk_test_sandbox_all", "Origin", "http://localhost:3000"); rep.header.Get("Access-Control-Allow-Origin") != "" {
		t.Error("a CORS header without -cors-origin")
	}
}

// TestBannerSaysWhereItListens: an address other machines reach is said so on the banner.
func TestBannerSaysWhereItListens(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ addr, want string }{
		{"127.0.0.1:8080", ""},
		{"[::1]:8080", ""},
		{"0.0.0.0:8080", "Listening on every network interface (-addr :8080)"},
		{"[::]:8080", "Listening on every network interface (-addr :8080)"},
		{"192.0.2.7:8080", "Listening on 192.0.2.7 (-addr :8080), not loopback"},
	} {
		t.Run(tt.addr, func(t *testing.T) {
			addr, _ := net.ResolveTCPAddr("tcp", tt.addr)
			if got := exposure(addr, "-addr", ":8080"); !strings.HasPrefix(got, tt.want) || (tt.want == "") != (got == "") {
				t.Errorf("exposure(%s) = %q, want %q...", tt.addr, got, tt.want)
			}
		})
	}
	err := run(context.Background(), nil, func(k string) string { return map[string]string{"SANDBOX_ADDR": "nonsense"}[k] }, io.Discard, io.Discard, nil)
	if want := "SANDBOX_ADDR nonsense: listen tcp: address nonsense: missing port in address"; err == nil || err.Error() != want {
		t.Errorf("run with SANDBOX_ADDR=nonsense = %v, want %s", err, want)
	}
}

// BenchmarkLandingPage: GET / costs the same whatever the dataset.
func BenchmarkLandingPage(b *testing.B) {
	for _, tt := range []struct {
		name string
		data []byte
	}{
		{"default", defaultDataset},
		{"shipments=100000", pageDataset(1, 1, 100000, 1, 12, "x")},
		{"tenants=40000", pageDataset(40000, 1, 1, 1, 12, "x")},
		{"sharing_one_number=500000", sharedNumberLater(500000)},
	} {
		b.Run(tt.name, func(b *testing.B) {
			sb, err := loadBytes("bench", tt.data, 0, testNow, slog.New(slog.DiscardHandler))
			if err != nil {
				b.Fatal(err)
			}
			s, err := newServer(sb, serverOptions{access: newLogBuffer(io.Discard, time.Hour), loopback: true, journal: defaultJournal})
			if err != nil {
				b.Fatal(err)
			}
			benchServe(b, s.handler(), newRequest(http.MethodGet, "/", ""), 200)
		})
	}
	// The worst arrangement for its findings: 20 tenants of 5,000 orders that all change
	// status, each journal full of limit=100 pages walked before the changes, the last
	// after: some 5,000 findings each to judge. first-page-ms is the page right after, which
	// starts the counts aside and waits for them at most pageCountWait; the loop, the page
	// once they are made.
	b.Run("full_journals", func(b *testing.B) {
		const tenants, orders = 20, 5000
		var as, ks, os []string
		newest := time.Date(2026, 10, 31, 23, 0, 0, 0, time.UTC)
		for a := range tenants {
			as = append(as, fmt.Sprintf(`{"id":"acct_%02d","environments":["test"]}`, a))
			ks = append(ks, fmt.Sprintf(`{"key":"sk_test_page_%02d","account":"acct_%02d","environment":"test","scopes":["orders:read"]}`, a, a))
			for o := range orders {
				os = append(os, fmt.Sprintf(`{"id":"ord_%02d_%05d","account":"acct_%02d","environment":"test","merchant_reference":"R","platform":"ebay","status":"unfulfilled","created_at":%q,"changes":[{"status":"fulfilled","at":%q}]}`,
					a, o, a, formatTimestamp(newest.Add(-time.Duration(o)*time.Minute)), formatTimestamp(newest.Add(30*24*time.Hour))))
			}
		}
		sb, err := loadBytes("bench", []byte(dataset(strings.Join(as, ","), strings.Join(ks, ","), "", strings.Join(os, ","))), 0, testNow, slog.New(slog.DiscardHandler))
		if err != nil {
			b.Fatal(err)
		}
		s, err := newServer(sb, serverOptions{access: newLogBuffer(io.Discard, time.Hour), loopback: true, journal: defaultJournal})
		if err != nil {
			b.Fatal(err)
		}
		h := s.handler()
		for a := range tenants {
			key, cursor := fmt.Sprintf("sk_test_page_%02d", a), ""
			for i := range defaultJournal {
				at, target := newest.Add(time.Second), "/v1/orders?limit=100"
				if i == defaultJournal-1 {
					at = newest.Add(60 * 24 * time.Hour)
				} else if cursor != "" {
					target += "&cursor=" + cursor
				}
				w := &benchWriter{h: http.Header{}}
				h.ServeHTTP(w, newRequest("GET", target, key, "Prefer", `clock="`+formatTimestamp(at)+`"`))
				var p pageJSON
				if err := json.Unmarshal(w.buf, &p); err != nil || w.status != 200 {
					b.Fatalf("page %d: %d %s", i, w.status, w.buf)
				}
				cursor = ""
				if p.Pagination.NextCursor != nil {
					cursor = url.QueryEscape(*p.Pagination.NextCursor)
				}
			}
		}
		start := time.Now()
		h.ServeHTTP(&benchWriter{h: http.Header{}}, newRequest(http.MethodGet, "/", ""))
		first := time.Since(start)
		for _, tk := range s.landing.tenants { // the counts made aside
			if done := tk.t.countFindings(); done != nil {
				<-done
			}
		}
		benchServe(b, h, newRequest(http.MethodGet, "/", ""), 200)
		b.ReportMetric(float64(first.Microseconds())/1000, "first-page-ms") // after benchServe: ResetTimer drops metrics
	})
}

// BenchmarkHealthz is the cheapest answer the service gives (no key, a prepared 15-byte
// body): what the fixed chain (request id, headers, router, log line) costs by itself.
func BenchmarkHealthz(b *testing.B) {
	benchServe(b, benchEnv(b, 0).h, newRequest("GET", "/healthz", ""), 200)
}

// ===== auth.go: Keys and scopes, and the rate limit =====

// auth.go: keys on every operation, the rate limit.

func TestEveryKeyOnEveryOperation(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	type outcome struct {
		status int
		code   string
	}
	tests := []struct {
		key      string
		tracking outcome
		orders   outcome
	}{
		{"sk_test_sandbox_all", outcome{200, ""}, outcome{200, ""}},
		{"sk_test_sandbox_tracking", outcome{200, ""}, outcome{403, "insufficient_scope"}},
		{"sk_test_sandbox_orders", outcome{403, "insufficient_scope"}, outcome{200, ""}},
		{"sk_test_sandbox_none", outcome{403, "insufficient_scope"}, outcome{403, "insufficient_scope"}},
		{"sk_test_sandbox_expired", outcome{401, "expired_api_key"}, outcome{401, "expired_api_key"}},
		{"sk_test_sandbox_revoked", outcome{401, "revoked_api_key"}, outcome{401, "revoked_api_key"}},
		{"sk_live_sandbox_all", outcome{503, "live_not_released"}, outcome{503, "live_not_released"}},
		{"sk_test_unknown", outcome{401, "invalid_api_key"}, outcome{401, "invalid_api_key"}},
	}
	for _, tt := range tests {
		for _, op := range operations {
			t.Run(tt.key+" "+op.name, func(t *testing.T) {
				want := tt.tracking
				if op.scope == "orders:read" {
					want = tt.orders
				}
				rep := e.get(t, op.target, tt.key)
				if want.status == 200 {
					if rep.status != 200 {
						t.Fatalf("GET %s = %s, want 200", op.target, rep)
					}
					return
				}
				wantProblem(t, rep, want.status, want.code, "")
				challenge := rep.header.Get("WWW-Authenticate")
				switch want.status {
				case 401:
					if challenge != `Bearer realm="sandbox"` {
						t.Errorf("WWW-Authenticate = %q, want Bearer realm=\"sandbox\"", challenge)
					}
				case 403:
					if w := `Bearer error="insufficient_scope", scope="` + op.scope + `"`; challenge != w {
						t.Errorf("WWW-Authenticate = %q, want %q", challenge, w)
					}
					if p := rep.problem(t); !strings.Contains(p.Detail, op.scope) {
						t.Errorf("403 detail %q does not name the scope %s", p.Detail, op.scope)
					}
				default:
					if challenge != "" {
						t.Errorf("WWW-Authenticate = %q on a %d, want none", challenge, want.status)
					}
				}
			})
		}
	}
	// sk_test_other_all: its own resources, never acct_sandbox's.
	for _, op := range operations {
		rep := e.get(t, op.target, "sk_test_other_all")
		switch op.name {
		case "tracking by number": // acct_other's own shipment has the same number
			if rep.status != 200 || !strings.Contains(string(rep.body), `"shipment_id":"shp_other_1"`) {
				t.Errorf("GET %s (sk_test_other_all) = %s, want shp_other_1", op.target, rep)
			}
			continue
		case "list orders":
			if rep.status != 200 || !strings.Contains(string(rep.body), "ord_other_0001") || strings.Contains(string(rep.body), "ord_sbx") {
				t.Errorf("GET /v1/orders (sk_test_other_all) = %s, want acct_other's order only", rep)
			}
			continue
		}
		wantProblem(t, rep, 404, "not_found", "")
	}
}

func TestAuthorizationHeaderVariants(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	tests := []struct {
		name    string
		headers []string
		status  int
		code    string
	}{
		{"no header", nil, 401, "missing_api_key"},
		{"empty header", []string{"Authorization", ""}, 401, "missing_api_key"},
		{"Basic scheme", []string{"Authorization", "Basic c2tfdGVzdF9zYW5kYm94X2FsbDo="}, 401, "missing_api_key"},
		{"Token scheme", []string{"Authorization", "Token sk_test_sandbox_all"}, 401, "missing_api_key"},
		{"key without scheme", []string{"Authorization", "sk_test_sandbox_all"}, 401, "missing_api_key"},
		{"Bearer glued to key", []string{"Authorization", "Bearersk_test_sandbox_all"}, 401, "missing_api_key"},
		{"Bearer alone", []string{"Authorization", "Bearer"}, 401, "invalid_api_key"},
		{"Bearer and spaces", []string{"Authorization", "Bearer    "}, 401, "invalid_api_key"},
		{"unknown key", []string{"Authorization", "Bearer sk_test_nope"}, 401, "invalid_api_key"},
		{"key with a suffix", []string{"Authorization", "Bearer sk_test_sandbox_allx"}, 401, "invalid_api_key"},
		{"key in other case", []string{"Authorization", "Bearer SK_TEST_SANDBOX_ALL"}, 401, "invalid_api_key"},
		{"two keys in one header", []string{"Authorization", "Bearer sk_test_sandbox_all sk_test_sandbox_all"}, 401, "invalid_api_key"},
		{"two Authorization headers", []string{"Authorization", "Bearer sk_test_sandbox_all", "Authorization", "Bearer sk_test_sandbox_all"}, 401, "invalid_api_key"},
		{"scheme is case-insensitive", []string{"Authorization", "bearer sk_test_sandbox_all"}, 200, ""},
		{"BEARER", []string{"Authorization", "BEARER sk_test_sandbox_all"}, 200, ""},
		{"Digest scheme", []string{"Authorization", `Digest username="x"`}, 401, "missing_api_key"},
		{"Bearer and a tab", []string{"Authorization", "Bearer\tsk_test_sandbox_all"}, 401, "missing_api_key"},
		{"two Authorization headers, one bad", []string{"Authorization", "Bearer nope", "Authorization", "Bearer sk_test_sandbox_all"}, 401, "invalid_api_key"},
		{"key with a trailing comma", []string{"Authorization", "Bearer sk_test_sandbox_all,"}, 401, "invalid_api_key"},
		{"key quoted", []string{"Authorization", `Bearer "sk_test_sandbox_all"`}, 401, "invalid_api_key"},
		{"a 10 KiB key", []string{"Authorization", "Bearer " + strings.Repeat("k", 10<<10)}, 401, "invalid_api_key"},
		{"a key with control bytes", []string{"Authorization", "Bearer sk_test\x00sandbox_all"}, 401, "invalid_api_key"},
		{"a key with non-UTF-8 bytes", []string{"Authorization", "Bearer sk_\xff\xfe"}, 401, "invalid_api_key"},
		{"several spaces after the scheme", []string{"Authorization", "Bearer   sk_test_sandbox_all"}, 200, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := e.get(t, "/v1/orders", "", tt.headers...)
			if tt.status == 200 {
				if rep.status != 200 {
					t.Fatalf("status = %s, want 200", rep)
				}
				return
			}
			wantProblem(t, rep, tt.status, tt.code, "")
			if got := rep.header.Get("WWW-Authenticate"); got != `Bearer realm="sandbox"` {
				t.Errorf("WWW-Authenticate = %q, want Bearer realm=\"sandbox\"", got)
			}
			if rep.header.Get("RateLimit") != "" {
				t.Errorf("a 401 carries RateLimit %q: an unknown caller has no rate-limit state", rep.header.Get("RateLimit"))
			}
		})
	}
}

// TestOtherTenantsLookExactlyMissing: a resource of another account or environment answers
// exactly as a resource that does not exist (only the request id differs).
func TestOtherTenantsLookExactlyMissing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	pairs := []struct{ foreign, missing, key string }{
		{"/v1/orders/ord_other_0001", "/v1/orders/ord_nope_0001", "sk_test_sandbox_all"},
		{"/v1/orders/ord_sbx_live_0001", "/v1/orders/ord_nope_0001", "sk_test_sandbox_all"},
		{"/v1/orders/ord_sbx_0001", "/v1/orders/ord_nope_0001", "sk_test_other_all"},
		{"/v1/shipments/shp_other_1/tracking", "/v1/shipments/shp_nope/tracking", "sk_test_sandbox_all"},
		{"/v1/shipments/shp_sbx_live/tracking", "/v1/shipments/shp_nope/tracking", "sk_test_sandbox_all"},
		{"/v1/shipments/shp_sbx_spring/tracking", "/v1/shipments/shp_nope/tracking", "sk_test_other_all"},
		{"/v1/tracking/SBX9000000001", "/v1/tracking/SBX0000000000", "sk_test_sandbox_all"},
	}
	for _, p := range pairs {
		foreign, missing := e.get(t, p.foreign, p.key), e.get(t, p.missing, p.key)
		wantProblem(t, foreign, 404, "not_found", "")
		if a, b := withoutRequestID(t, foreign.body), withoutRequestID(t, missing.body); a != b {
			t.Errorf("GET %s (%s) = %s\nbut a missing resource answers %s", p.foreign, p.key, a, b)
		}
		for _, h := range []string{"Content-Type", "Content-Length", "Cache-Control", "RateLimit"} {
			if foreign.header.Get(h) != missing.header.Get(h) {
				t.Errorf("%s: header %s = %q, missing resource has %q", p.foreign, h, foreign.header.Get(h), missing.header.Get(h))
			}
		}
	}
}

func TestRateLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{step: -1}) // the clock stands still unless advanced
	const key = "sk_test_sandbox_all"
	for i := 0; i < 25; i++ {
		rep := e.get(t, "/v1/orders/ord_sbx_0001", key)
		want := fmt.Sprintf(`"default";r=%d;t=1`, 24-i)
		if rep.status != 200 || rep.header.Get("RateLimit") != want || rep.header.Get("RateLimit-Policy") != `"default";q=25;w=1` {
			t.Fatalf("request %d = %d, RateLimit %q, RateLimit-Policy %q; want 200, %s, \"default\";q=25;w=1", i+1, rep.status, rep.header.Get("RateLimit"), rep.header.Get("RateLimit-Policy"), want)
		}
	}
	rep := e.get(t, "/v1/orders/ord_sbx_0001", key)
	wantProblem(t, rep, 429, "rate_limited", "")
	if rep.header.Get("Retry-After") != "1" || rep.header.Get("RateLimit") != `"default";r=0;t=1` {
		t.Errorf("429 Retry-After %q, RateLimit %q; want 1 and r=0", rep.header.Get("Retry-After"), rep.header.Get("RateLimit"))
	}
	// Another key of the same account has its own bucket.
	if rep := e.get(t, "/v1/orders", "sk_test_sandbox_orders"); rep.status != 200 || rep.header.Get("RateLimit") != `"default";r=24;t=1` {
		t.Errorf("another key = %d with RateLimit %q, want 200 and a full bucket", rep.status, rep.header.Get("RateLimit"))
	}
	// One token comes back every 40 ms; a second later the bucket is full.
	e.clock.advance(40 * time.Millisecond)
	if rep := e.get(t, "/v1/orders", key); rep.status != 200 || rep.header.Get("RateLimit") != `"default";r=0;t=1` {
		t.Errorf("after 40 ms = %d with RateLimit %q, want 200 and r=0", rep.status, rep.header.Get("RateLimit"))
	}
	wantProblem(t, e.get(t, "/v1/orders", key), 429, "rate_limited", "")
	e.clock.advance(time.Second)
	if rep := e.get(t, "/v1/orders", key); rep.status != 200 || rep.header.Get("RateLimit") != `"default";r=24;t=1` {
		t.Errorf("after a second = %d with RateLimit %q, want 200 and r=24", rep.status, rep.header.Get("RateLimit"))
	}
	// The rate limit comes before the scope: a key without the scope spends tokens too.
	for i := 0; i < 25; i++ {
		wantProblem(t, e.get(t, "/v1/orders", "sk_test_sandbox_none"), 403, "insufficient_scope", "")
	}
	wantProblem(t, e.get(t, "/v1/orders", "sk_test_sandbox_none"), 429, "rate_limited", "")
	// Answers after the limiter carry its state; answers before it do not.
	if rep := e.get(t, "/v1/orders?limit=0", "sk_test_sandbox_tracking"); rep.header.Get("RateLimit") == "" {
		t.Errorf("a 403 of a known key has no RateLimit field")
	}
	for _, k := range []string{"", "sk_test_nope", "sk_test_sandbox_expired", "sk_live_sandbox_all"} {
		if rep := e.get(t, "/v1/orders", k); rep.header.Get("RateLimit") != "" || rep.header.Get("RateLimit-Policy") != "" {
			t.Errorf("key %q: %d carries RateLimit fields", k, rep.status)
		}
	}

	off := newEnv(t, envOptions{rate: -1, step: -1})
	for i := 0; i < 500; i++ {
		rep := off.get(t, "/v1/orders", key)
		if rep.status != 200 || rep.header.Get("RateLimit") != "" || rep.header.Get("RateLimit-Policy") != "" {
			t.Fatalf("with -rate 0, request %d = %d with RateLimit %q", i, rep.status, rep.header.Get("RateLimit"))
		}
	}
}

func TestRateLimitOfOtherSettings(t *testing.T) {
	t.Parallel()
	l := newRateLimit(3, testNow)
	var b bucket
	for i, want := range []int{2, 1, 0} {
		if r, ok, _ := l.take(&b, testNow); !ok || r != want {
			t.Fatalf("take %d = %d, %v; want %d, true", i, r, ok, want)
		}
	}
	if _, ok, wait := l.take(&b, testNow); ok || wait <= 0 || wait > time.Second {
		t.Errorf("take on an empty bucket = ok %v, wait %v; want false and a wait within a second", ok, wait)
	}
	if newRateLimit(0, testNow) != nil {
		t.Error("a rate of 0 makes a limiter, want none")
	}
}

// ===== auth.go: Tenants, their clocks and timelines, and the clock operations =====

// auth.go, the sandbox clock (a tenant's; every read obeys it), and the timelines a
// dataset schedules on it, with the acct_sync tenant built on them.

// clockJSON is a clock operation's answer; FrozenTime is "" for null.
type clockJSON struct {
	FrozenTime, RunningFrom, Now, StartedAt string
}

// setClock freezes key's tenant's clock at frozen ("" for null) and returns the answer.
func (e *env) setClock(t testing.TB, key, frozen string) clockJSON {
	t.Helper()
	body := `{"frozen_time":null}`
	if frozen != "" {
		body = `{"frozen_time":"` + frozen + `"}`
	}
	rep := e.do(t, newBodyRequest(http.MethodPost, "/v1/test_helpers/clock", key, body))
	if rep.status != 200 {
		t.Fatalf("POST clock %s = %s, want 200", body, rep)
	}
	return decodeClock(t, rep)
}

func (e *env) readClock(t testing.TB, key string) clockJSON {
	t.Helper()
	return decodeClock(t, e.get(t, "/v1/test_helpers/clock", key))
}

func decodeClock(t testing.TB, rep reply) clockJSON {
	t.Helper()
	var c struct {
		FrozenTime  *string `json:"frozen_time"`
		RunningFrom *string `json:"running_from"`
		Now         string  `json:"now"`
		StartedAt   string  `json:"started_at"`
	}
	dec := json.NewDecoder(bytes.NewReader(rep.body))
	dec.DisallowUnknownFields()
	if rep.status != 200 || dec.Decode(&c) != nil {
		t.Fatalf("clock answer %s", rep)
	}
	return clockJSON{*cmp.Or(c.FrozenTime, new(string)), *cmp.Or(c.RunningFrom, new(string)), c.Now, c.StartedAt}
}

// eventsOf is the number of events and the status a tracking view shows.
func eventsOf(t testing.TB, rep reply) (int, string) {
	t.Helper()
	var v trackingView
	if rep.status != 200 || json.Unmarshal(rep.body, &v) != nil {
		t.Fatalf("tracking view %s", rep)
	}
	return len(v.Events), v.Status
}

func TestClockAnswers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{step: -1, rate: -1})
	const key = "sk_test_sandbox_all"
	if c := e.readClock(t, key); c.FrozenTime != "" || c.Now != "2026-11-22T12:00:00Z" || c.StartedAt != "2026-11-22T12:00:00Z" {
		t.Errorf("GET clock = %+v, want following the wall clock, started at the start instant", c)
	}
	frozen := e.setClock(t, key, "2026-03-29T02:30:00.5+01:00")
	if frozen.FrozenTime != "2026-03-29T01:30:00.5Z" || frozen.Now != "2026-03-29T01:30:00.5Z" {
		t.Errorf("POST freeze = %+v, want frozen at 2026-03-29T01:30:00.5Z", frozen)
	}
	if c := e.readClock(t, key); c != frozen {
		t.Errorf("GET after the freeze = %+v, want %+v", c, frozen)
	}
	// Other tenants' clocks do not move; every key of the tenant sees the same clock.
	if c := e.readClock(t, "sk_test_other_all"); c.FrozenTime != "" {
		t.Errorf("acct_other's clock = %+v, want it following the wall clock", c)
	}
	if c := e.readClock(t, "sk_test_sandbox_none"); c != frozen {
		t.Errorf("a key without scopes sees %+v, want the tenant's clock %+v", c, frozen)
	}
	if c := e.setClock(t, "sk_test_sandbox_tracking", ""); c.FrozenTime != "" || c.Now != "2026-11-22T12:00:00Z" {
		t.Errorf("POST null = %+v, want the wall clock again", c)
	}
	// Live keys: 503 as everywhere; HEAD and other methods.
	wantProblem(t, e.get(t, "/v1/test_helpers/clock", "sk_live_sandbox_all"), 503, "live_not_released", "")
	rep := e.do(t, newRequest(http.MethodPut, "/v1/test_helpers/clock", key))
	wantProblem(t, rep, 405, "method_not_allowed", "")
	if rep.header.Get("Allow") != "GET, HEAD, POST" {
		t.Errorf("Allow = %q, want GET, HEAD, POST", rep.header.Get("Allow"))
	}
	if rep := e.do(t, newRequest(http.MethodHead, "/v1/test_helpers/clock", key)); rep.status != 200 {
		t.Errorf("HEAD clock = %s, want 200", rep)
	}
}

// TestClockBadRequestsChangeNothing: every refused request leaves the clock as it was.
func TestClockBadRequestsChangeNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{step: -1, rate: -1})
	const key = "sk_test_sandbox_all"
	before := e.setClock(t, key, "2026-01-01T00:00:00Z")
	tests := []struct {
		name, target, body string
		headers            []string
		status             int
		code, param        string
	}{
		{"not JSON", "", "frozen_time=x", nil, 400, "malformed_json", ""},
		{"empty", "", "", nil, 400, "malformed_json", ""},
		{"an array", "", `[{"frozen_time":null}]`, nil, 400, "malformed_json", ""},
		{"a string", "", `"2026-01-01T00:00:00Z"`, nil, 400, "malformed_json", ""},
		{"null", "", `null`, nil, 400, "malformed_json", ""},
		{"trailing data", "", `{"frozen_time":null} {}`, nil, 400, "malformed_json", ""},
		{"cut short", "", `{"frozen_time":`, nil, 400, "malformed_json", ""},
		{"invalid UTF-8", "", "{\"frozen_time\":\"\xff\"}", nil, 400, "malformed_json", ""},
		{"another member", "", `{"frozen_time":null,"speed":2}`, nil, 422, "unknown_parameter", "speed"},
		{"a member in another case", "", `{"Frozen_Time":"2026-01-01T00:00:00Z"}`, nil, 422, "unknown_parameter", "Frozen_Time"},
		{"members in the order sent", "", `{"x":1,"frozen_time":"bad"}`, nil, 422, "unknown_parameter", "x"},
		{"members in the order sent, the other way", "", `{"frozen_time":"bad","x":1}`, nil, 422, "invalid_parameter", "frozen_time"},
		{"frozen_time twice", "", `{"frozen_time":null,"frozen_time":"2026-01-01T00:00:00Z"}`, nil, 422, "invalid_parameter", "frozen_time"},
		{"missing", "", `{}`, nil, 422, "invalid_parameter", "frozen_time"},
		{"missing, judged last", "", `{"y":1}`, nil, 422, "unknown_parameter", "y"},
		{"a number", "", `{"frozen_time":1767225600}`, nil, 422, "invalid_parameter", "frozen_time"},
		{"true", "", `{"frozen_time":true}`, nil, 422, "invalid_parameter", "frozen_time"},
		{"no offset", "", `{"frozen_time":"2026-01-01T00:00:00"}`, nil, 422, "invalid_parameter", "frozen_time"},
		{"hour 24", "", `{"frozen_time":"2026-01-01T24:00:00Z"}`, nil, 422, "invalid_parameter", "frozen_time"},
		{"a query parameter, before the body", "?at=now", `not json`, nil, 422, "unknown_parameter", "at"},
		{"over 256 KiB", "", `{"frozen_time":null,"pad":"` + strings.Repeat("x", maxBodyBytes) + `"}`, nil, 413, "body_too_large", ""},
		{"a simulated failure", "", `{"frozen_time":null}`, []string{"Prefer", "code=503"}, 503, "provider_unavailable", ""},
		{"a bad Prefer", "", `{"frozen_time":null}`, []string{"Prefer", "delay=-1"}, 422, "invalid_parameter", "Prefer"},
		// run_from, and both members: each by its name, then whether it is given again, then its
		// value, in the order sent; then both (naming the second sent); neither is frozen_time's.
		{"run_from null", "", `{"run_from":null}`, nil, 422, "invalid_parameter", "run_from"},
		{"run_from null before a bad frozen_time", "", `{"run_from":null,"frozen_time":"x"}`, nil, 422, "invalid_parameter", "run_from"},
		{"frozen_time null, then run_from", "", `{"frozen_time":null,"run_from":"start"}`, nil, 422, "invalid_parameter", "run_from"},
		{"run_from, then frozen_time", "", `{"run_from":"start","frozen_time":"2026-01-01T00:00:00Z"}`, nil, 422, "invalid_parameter", "frozen_time"},
		{"run_from twice", "", `{"run_from":"start","run_from":"start"}`, nil, 422, "invalid_parameter", "run_from"},
		{"run_from no instant", "", `{"run_from":"soon"}`, nil, 422, "invalid_parameter", "run_from"},
		{"run_from a number", "", `{"run_from":5}`, nil, 422, "invalid_parameter", "run_from"},
		{"run_from a relative instant spelt wrong", "", `{"run_from":"start + 90s"}`, nil, 422, "invalid_parameter", "run_from"},
		{"frozen_time a relative instant spelt wrong", "", `{"frozen_time":"start+"}`, nil, 422, "invalid_parameter", "frozen_time"},
		{"run_from in another case", "", `{"Run_From":"start"}`, nil, 422, "unknown_parameter", "Run_From"},
		{"run_from past a duration", "", `{"run_from":"start+9999999999h"}`, nil, 422, "invalid_parameter", "run_from"},
		{"no key", "", `{"frozen_time":null}`, []string{"Authorization", "Basic x"}, 401, "missing_api_key", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newBodyRequest(http.MethodPost, "/v1/test_helpers/clock"+tt.target, key, tt.body, tt.headers...)
			if tt.status == 401 {
				r.Header.Set("Authorization", "Basic x")
			}
			wantProblem(t, e.do(t, r), tt.status, tt.code, tt.param)
			if c := e.readClock(t, key); c != before {
				t.Errorf("the clock is %+v after a refused request, want %+v", c, before)
			}
		})
	}
	// The streamed size too (no Content-Length): read up to the cap, then refused.
	r := newBodyRequest(http.MethodPost, "/v1/test_helpers/clock", key, "")
	r.Body, r.ContentLength = io.NopCloser(chunkedBody{io.LimitReader(neverEnding(' '), maxBodyBytes+1)}), -1
	wantProblem(t, e.do(t, r), 413, "body_too_large", "")
	// A GET takes no parameters either.
	wantProblem(t, e.get(t, "/v1/test_helpers/clock?frozen_time=x", key), 422, "unknown_parameter", "frozen_time")
	if c := e.readClock(t, key); c != before {
		t.Errorf("the clock is %+v, want %+v", c, before)
	}
}

// TestClockGovernsTracking: an event shows when its instant is at or before the tenant's
// clock; the status is that of the last shown event; a shipment is always found.
func TestClockGovernsTracking(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{step: -1, rate: -1})
	const key = "sk_test_sandbox_all"
	tests := []struct {
		at         string
		wantEvents int
		wantStatus string
	}{
		{"2026-03-28T17:59:59.999999999Z", 0, "pre_transit"},
		{"2026-03-28T18:00:00Z", 1, "pre_transit"},
		{"2026-03-29T01:29:59.999999999Z", 2, "in_transit"},
		{"2026-03-29T02:30:00+01:00", 3, "in_transit"}, // exactly the third event's instant
		{"2026-03-29T12:05:00Z", 5, "delivered"},
		{"9999-12-31T23:59:59Z", 5, "delivered"},
		{"0000-01-01T00:00:00Z", 0, "pre_transit"},
	}
	full := e.get(t, "/v1/shipments/shp_sbx_spring/tracking", key).body
	for _, tt := range tests {
		t.Run(tt.at, func(t *testing.T) {
			e.setClock(t, key, tt.at)
			for _, target := range []string{"/v1/shipments/shp_sbx_spring/tracking", "/v1/tracking/SBX1000000001"} {
				rep := e.get(t, target, key)
				n, status := eventsOf(t, rep)
				if n != tt.wantEvents || status != tt.wantStatus {
					t.Errorf("at %s, GET %s shows %d events, status %s; want %d, %s", tt.at, target, n, status, tt.wantEvents, tt.wantStatus)
				}
				var v, whole trackingView
				mustDecode(t, rep.body, &v)
				mustDecode(t, full, &whole)
				if !slices.Equal(v.Events, whole.Events[:n]) {
					t.Errorf("at %s the events shown are not the first %d of the full view", tt.at, n)
				}
			}
		})
	}
	// Another tenant's clock did not move: its shipment shows every event.
	if n, _ := eventsOf(t, e.get(t, "/v1/shipments/shp_other_1/tracking", "sk_test_other_all")); n != 1 {
		t.Errorf("acct_other's shipment shows %d events, want 1", n)
	}
}

// TestShipmentEvents: shp_sbx_moving's events happen after the start instant; the first
// two minutes take it from label to delivery.
func TestShipmentEvents(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{step: -1, rate: -1})
	const key = "sk_test_sandbox_all"
	for _, tt := range []struct {
		after      time.Duration
		wantEvents int
		wantStatus string
	}{
		{-time.Nanosecond, 0, "pre_transit"}, {0, 1, "pre_transit"}, {29 * time.Second, 1, "pre_transit"}, {30 * time.Second, 2, "in_transit"},
		{60 * time.Second, 3, "in_transit"}, {90 * time.Second, 4, "out_for_delivery"}, {119 * time.Second, 4, "out_for_delivery"}, {2 * time.Minute, 5, "delivered"},
	} {
		t.Run(fmt.Sprint("start+", tt.after), func(t *testing.T) {
			e.setClock(t, key, formatTimestamp(testNow.Add(tt.after)))
			n, status := eventsOf(t, e.get(t, "/v1/tracking/SBX4000000001", key))
			if n != tt.wantEvents || status != tt.wantStatus {
				t.Errorf("%v after the start: %d events, %s; want %d, %s", tt.after, n, status, tt.wantEvents, tt.wantStatus)
			}
		})
	}
	var v trackingView
	mustDecode(t, e.get(t, "/v1/shipments/shp_sbx_moving/tracking", key).body, &v)
	if v.Events[4].Timestamp != "2026-11-22T12:02:00Z" || v.Events[0].Location != "London, GB" {
		t.Errorf("shp_sbx_moving = %+v, want its last event at the start instant + 2 minutes", v)
	}
}

// TestExceptionPaths: the moving shipments that are not "label, transit, delivered", at
// each instant of their schedule and the nanosecond before it, by Prefer clock, by id and
// by number: a failure that is not final, a pickup collected, a pickup never collected, and
// a shipment with no scan for days.
func TestExceptionPaths(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1})
	const key = "sk_test_sandbox_all"
	type step struct {
		at     string // relative to the start
		status string
		last   string // the last event's description, "" for none
	}
	for _, tt := range []struct {
		id, number string
		steps      []step
	}{
		{"shp_sbx_reattempt", "SBX4000000002", []step{{"start-1ns", "pre_transit", ""}, {"start", "pre_transit", "Label created"},
			{"start+19.999999999s", "pre_transit", "Label created"}, {"start+20s", "out_for_delivery", "Out for delivery"},
			{"start+40s", "failure", "Delivery attempted: recipient not available"}, {"start+59.999999999s", "failure", "Delivery attempted: recipient not available"},
			{"start+60s", "out_for_delivery", "Out for delivery, second attempt"}, {"start+80s", "delivered", "Delivered"}}},
		{"shp_sbx_collected", "SBX4000000003", []step{{"start", "pre_transit", "Label created"}, {"start+30s", "in_transit", "Departed facility"},
			{"start+60s", "available_for_pickup", "Available for collection at the pickup point"}, {"start+89.999999999s", "available_for_pickup", "Available for collection at the pickup point"},
			{"start+90s", "delivered", "Collected by the recipient"}}},
		{"shp_sbx_uncollected", "SBX4000000004", []step{{"start", "pre_transit", "Label created"}, {"start+30s", "available_for_pickup", "Available for collection at the pickup point"},
			{"start+119.999999999s", "available_for_pickup", "Available for collection at the pickup point"}, {"start+120s", "return_to_sender", "Not collected: returning to sender"}}},
		{"shp_sbx_stalled", "SBX4000000005", []step{{"start-100h1ns", "pre_transit", ""}, {"start-100h", "pre_transit", "Label created"},
			{"start-80h", "in_transit", "Departed facility"}, {"start", "in_transit", "Departed facility"}, {"start+8760h", "in_transit", "Departed facility"}}},
	} {
		for _, st := range tt.steps {
			t.Run(tt.id+" at "+st.at, func(t *testing.T) {
				prefer := `clock="` + st.at + `"`
				byID, byNumber := e.get(t, "/v1/shipments/"+tt.id+"/tracking", key, "Prefer", prefer), e.get(t, "/v1/tracking/"+tt.number, key, "Prefer", prefer)
				var v trackingView
				if err := json.Unmarshal(byID.body, &v); err != nil || byID.status != 200 || !bytes.Equal(byID.body, byNumber.body) {
					t.Fatalf("at %s by id = %s, by number = %s; want the same 200 view", st.at, byID, byNumber)
				}
				last := ""
				if len(v.Events) > 0 {
					last = v.Events[len(v.Events)-1].Description
				}
				if v.Status != st.status || last != st.last {
					t.Errorf("%s at %s: %s, last event %q; want %s, %q", tt.id, st.at, v.Status, last, st.status, st.last)
				}
			})
		}
	}
}

// TestClockGovernsOrders: an order exists from its created_at: a frozen clock lists
// exactly what created_to at that instant lists, across pages and per status, and an order
// created after the clock is 404.
func TestClockGovernsOrders(t *testing.T) {
	t.Parallel()
	const key = "sk_test_sandbox_all"
	e := newEnv(t, envOptions{seed: 300, rate: -1, step: -1, secret: "s"})
	all := e.walk(t, key, "", 100)
	for _, i := range []int{0, 1, 5, 150, 299, 300} {
		at := all[i].CreatedAt
		e.setClock(t, key, "")
		for _, status := range []string{"", "&status=fulfilled", "&status=cancelled"} {
			for _, limit := range []int{7, 100} {
				bounded := ids(e.walk(t, key, "created_to="+at+status, limit))
				e.setClock(t, key, at)
				frozen := ids(e.walk(t, key, status, limit))
				later := ids(e.walk(t, key, "created_to=2099-01-01T00:00:00Z"+status, limit))
				earlier := ids(e.walk(t, key, "created_to="+all[min(i+10, len(all)-1)].CreatedAt+status, limit))
				e.setClock(t, key, "")
				if !slices.Equal(frozen, bounded) || !slices.Equal(later, bounded) {
					t.Errorf("frozen at %s (%q, limit %d): %d orders, %d with a later created_to; created_to alone lists %d", at, status, limit, len(frozen), len(later), len(bounded))
				}
				if want := ids(e.walk(t, key, "created_to="+all[min(i+10, len(all)-1)].CreatedAt+status, limit)); !slices.Equal(earlier, want) {
					t.Errorf("frozen at %s, an earlier created_to lists %d, want %d", at, len(earlier), len(want))
				}
			}
		}
	}
	// An order before its created_at does not exist; at it, it does.
	e.setClock(t, key, "2026-11-01T09:29:59.999999999Z")
	wantProblem(t, e.get(t, "/v1/orders/ord_sbx_0001", key), 404, "not_found", "")
	if p := decodePage(t, e.get(t, "/v1/orders?created_from=2026-11-01T00:00:00Z", key)); len(p.Data) != 0 {
		t.Errorf("before ord_sbx_0001's created_at the list shows %v", ids(p.Data))
	}
	e.setClock(t, key, "2026-11-01T09:30:00Z")
	if rep := e.get(t, "/v1/orders/ord_sbx_0001", key); rep.status != 200 || string(rep.body) != sandboxOrderJSON {
		t.Errorf("at ord_sbx_0001's created_at, GET = %s, want 200 %s", rep, sandboxOrderJSON)
	}
	// Cursors do not bind the clock: a cursor made under one clock pages on under another.
	e.setClock(t, key, "")
	p1 := decodePage(t, e.get(t, "/v1/orders?limit=10", key))
	e.setClock(t, key, all[5].CreatedAt)
	p2 := decodePage(t, e.get(t, "/v1/orders?limit=10&cursor="+*p1.Pagination.NextCursor, key))
	if len(p2.Data) != 10 || p2.Data[0].ID != all[10].ID {
		t.Errorf("a cursor under another clock: page %v, want it to start at %s", ids(p2.Data), all[10].ID)
	}
}

// TestClockGovernsKeyExpiry: a key is expired when its expires_at is at or before its
// tenant's clock; the clock operations judge expiry by the wall clock.
func TestClockGovernsKeyExpiry(t *testing.T) {
	t.Parallel()
	data := dataset(dsAccounts, `{"key":"sk_test_a","account":"acct_a","environment":"test","scopes":["orders:read"],"expires_at":"2030-06-01T00:00:00Z"}`, "", dsOrder)
	e := newEnv(t, envOptions{data: []byte(data), step: -1, rate: -1})
	e.setClock(t, "sk_test_a", "2030-05-31T23:59:59Z")
	if rep := e.get(t, "/v1/orders", "sk_test_a"); rep.status != 200 {
		t.Errorf("a second before its expiry the key answers %s, want 200", rep)
	}
	e.setClock(t, "sk_test_a", "2030-06-01T00:00:00Z")
	wantProblem(t, e.get(t, "/v1/orders", "sk_test_a"), 401, "expired_api_key", "")
	// The clock itself still answers the key, so that the tenant can move it back.
	if c := e.setClock(t, "sk_test_a", ""); c.FrozenTime != "" {
		t.Errorf("resuming the wall clock = %+v, want frozen_time null", c)
	}
	if rep := e.get(t, "/v1/orders", "sk_test_a"); rep.status != 200 {
		t.Errorf("back on the wall clock the key answers %s, want 200", rep)
	}
	// The default dataset's expired key works before 2026-01-01.
	d := newEnv(t, envOptions{step: -1, rate: -1})
	d.setClock(t, "sk_test_sandbox_all", "2025-12-31T23:59:59Z")
	if rep := d.get(t, "/v1/orders/ord_sbx_0001", "sk_test_sandbox_expired"); rep.status != 404 {
		t.Errorf("sk_test_sandbox_expired before its expiry = %s, want 404 (the order does not exist yet)", rep)
	}
}

// TestAfterEvents: events scheduled with after (null means absent) are placed at the start
// instant plus after and normalized with the others; a shipment of 100,000 events loads,
// and the clock cuts its view anywhere.
func TestAfterEvents(t *testing.T) {
	t.Parallel()
	events := `{"after":"2m","status":"delivered","description":"Delivered"},` +
		`{"timestamp":"2026-11-22T12:01:00+01:00","after":null,"status":"in_transit","description":"Carrier time"},` +
		`{"after":"0s","status":"pre_transit","description":"Label created","timestamp":null}`
	data := dataset(dsAccounts, `{"key":"sk_test_a","account":"acct_a","environment":"test","scopes":["tracking:read"]}`,
		`{"id":"shp_1","account":"acct_a","environment":"test","reference":"S1","tracking_number":"T1","events":[`+events+`]}`, "")
	e := newEnv(t, envOptions{data: []byte(data), step: -1, rate: -1})
	want := `{"shipment_id":"shp_1","reference":"S1","tracking_number":"T1","status":"delivered","events":[` +
		`{"status":"in_transit","description":"Carrier time","timestamp":"2026-11-22T11:01:00Z","location":""},` +
		`{"status":"pre_transit","description":"Label created","timestamp":"2026-11-22T12:00:00Z","location":""},` +
		`{"status":"delivered","description":"Delivered","timestamp":"2026-11-22T12:02:00Z","location":""}]}`
	e.setClock(t, "sk_test_a", "2026-11-22T12:02:00Z")
	if rep := e.get(t, "/v1/tracking/T1", "sk_test_a"); string(rep.body) != want {
		t.Errorf("view = %s\nwant %s", rep.body, want)
	}

	var b strings.Builder
	for i := range 100000 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"after":"%ds","status":"in_transit","description":"Scan %d"}`, i, i)
	}
	big := dataset(dsAccounts, `{"key":"sk_test_a","account":"acct_a","environment":"test","scopes":["tracking:read"]}`,
		`{"id":"shp_big","account":"acct_a","environment":"test","reference":"S","tracking_number":"T","events":[`+b.String()+`]}`, "")
	e = newEnv(t, envOptions{data: []byte(big), step: -1, rate: -1, quiet: true})
	for _, k := range []int{0, 1, 50000, 100000} {
		e.setClock(t, "sk_test_a", formatTimestamp(testNow.Add(time.Duration(k)*time.Second-time.Nanosecond)))
		// The view is read as a whole once; megabytes of events are counted, not validated.
		rec := httptest.NewRecorder()
		e.h.ServeHTTP(rec, newRequest(http.MethodGet, "/v1/shipments/shp_big/tracking", "sk_test_a"))
		if n := strings.Count(rec.Body.String(), `"description":`); rec.Code != 200 || !json.Valid(rec.Body.Bytes()) || n != k {
			t.Errorf("%d seconds after the start, %d events show (%d), want %d", k, n, rec.Code, k)
		}
	}
}

// TestClockUnderConcurrency: many readers while a writer moves the clock (run with -race):
// every view is a whole view of some clock's events.
func TestClockUnderConcurrency(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, quiet: true})
	const key = "sk_test_sandbox_all"
	readWhile(4, func() bool {
		rec := httptest.NewRecorder()
		e.h.ServeHTTP(rec, newRequest(http.MethodGet, "/v1/shipments/shp_sbx_spring/tracking", key))
		var v trackingView
		if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &v) != nil || len(v.Events) > 0 && v.Status != v.Events[len(v.Events)-1].Status {
			t.Errorf("a read while the clock moves = %d %s", rec.Code, rec.Body)
			return false
		}
		return true
	}, func() {
		for i := range 200 {
			e.setClock(t, key, formatTimestamp(time.Date(2026, 3, 28, 17, 0, 0, 0, time.UTC).Add(time.Duration(i)*6*time.Minute)))
		}
	})
}

// readWhile calls read from readers goroutines, each until it fails (returns false) or move
// returns.
func readWhile(readers int, read func() bool, move func()) {
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if !read() {
					return
				}
			}
		}()
	}
	move()
	close(stop)
	wg.Wait()
}

// TestOneClockReadingPerRequest: a request's tenant clock is read once, when its key is
// found, and that reading judges the key's expiry and everything the answer shows. The
// wall clock here moves on 320 days at every reading, so that any second reading shows.
func TestOneClockReadingPerRequest(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1})
	e.clock.mu.Lock()
	e.clock.t, e.clock.step = time.Date(2025, 12, 31, 0, 0, 0, 0, time.UTC), 320*24*time.Hour
	e.clock.mu.Unlock()
	// sk_test_sandbox_expired is active before 2026-01-01, when ord_sbx_0001 (2026-11-01)
	// does not exist yet: no single instant lets it read that order.
	if rep := e.get(t, "/v1/orders", "sk_test_sandbox_expired"); rep.status != 200 || string(rep.body) != `{"data":[],"pagination":{"limit":20,"next_cursor":null,"has_more":false}}` {
		t.Errorf("sk_test_sandbox_expired on 2025-12-31 = %s, want 200 and no order: its key and its page judged at one instant", rep)
	}
}

// TestClockRunsFrom: {"run_from": <instant>} sets a clock running from an instant at the
// wall clock's pace: the POST answers now as run_from, later readings move with the wall
// clock, and shp_sbx_moving replays its two minutes live; relative instants are read against
// the start instant, in both members.
func TestClockRunsFrom(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{step: -1, rate: -1})
	const key = "sk_test_sandbox_all"
	e.clock.advance(10 * time.Minute) // the moving shipment delivered long ago
	if n, status := eventsOf(t, e.get(t, "/v1/shipments/shp_sbx_moving/tracking", key)); n != 5 || status != "delivered" {
		t.Fatalf("ten minutes after the start shp_sbx_moving has %d events, %s", n, status)
	}
	rep := e.do(t, newBodyRequest(http.MethodPost, "/v1/test_helpers/clock", key, `{"run_from":"start"}`))
	if c := decodeClock(t, rep); c != (clockJSON{"", "2026-11-22T12:00:00Z", "2026-11-22T12:00:00Z", "2026-11-22T12:00:00Z"}) {
		t.Errorf(`POST {"run_from":"start"} = %+v, want running from the start, now the start`, c)
	}
	for _, step := range []struct {
		wait   time.Duration
		events int
		status string
	}{{0, 1, "pre_transit"}, {29 * time.Second, 1, "pre_transit"}, {time.Second, 2, "in_transit"}, {60 * time.Second, 4, "out_for_delivery"}, {30 * time.Second, 5, "delivered"}} {
		e.clock.advance(step.wait)
		if n, status := eventsOf(t, e.get(t, "/v1/shipments/shp_sbx_moving/tracking", key)); n != step.events || status != step.status {
			t.Errorf("running from the start, %v of wall time on: %d events, %s; want %d, %s", step.wait, n, status, step.events, step.status)
		}
	}
	if c := e.readClock(t, key); c != (clockJSON{"", "2026-11-22T12:00:00Z", "2026-11-22T12:02:00Z", "2026-11-22T12:00:00Z"}) {
		t.Errorf("GET clock two minutes into the run = %+v", c)
	}
	if c := e.readClock(t, "sk_test_other_all"); c.RunningFrom != "" || c.Now != "2026-11-22T12:12:00Z" {
		t.Errorf("acct_other's clock = %+v, want it following the wall clock", c)
	}
	for body, want := range map[string]clockJSON{
		`{"run_from":"start+90s"}`:                 {"", "2026-11-22T12:01:30Z", "2026-11-22T12:01:30Z", "2026-11-22T12:00:00Z"},
		`{"run_from":"2026-03-29T02:30:00+01:00"}`: {"", "2026-03-29T01:30:00Z", "2026-03-29T01:30:00Z", "2026-11-22T12:00:00Z"},
		`{"frozen_time":"start-10m"}`:              {"2026-11-22T11:50:00Z", "", "2026-11-22T11:50:00Z", "2026-11-22T12:00:00Z"},
		`{"frozen_time":null}`:                     {"", "", "2026-11-22T12:12:00Z", "2026-11-22T12:00:00Z"},
	} {
		if c := decodeClock(t, e.do(t, newBodyRequest(http.MethodPost, "/v1/test_helpers/clock", key, body))); c != want {
			t.Errorf("POST %s = %+v, want %+v", body, c, want)
		}
	}
	e.do(t, newBodyRequest(http.MethodPost, "/v1/test_helpers/clock", key, `{"run_from":"start"}`))
	if page := string(e.get(t, "/", "").body); !strings.Contains(page, "As its sandbox clock shows it: 2026-11-22T12:00:00Z (+0s), running from 2026-11-22T12:00:00Z.") {
		t.Error("the page does not say the clock runs from the start")
	}
}

// TestClockAnswersAgreeWhileTheClockMoves: while another request freezes and unfreezes the
// clock, every GET clock answer is one reading: frozen_time, when set, is now; and no page
// of the expired key holds an order that only a later instant shows.
func TestClockAnswersAgreeWhileTheClockMoves(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, quiet: true})
	const frozen, past = "2026-03-29T01:00:00Z", "2025-06-01T00:00:00Z"
	readWhile(2, func() bool {
		rec := httptest.NewRecorder()
		e.h.ServeHTTP(rec, newRequest(http.MethodGet, "/v1/test_helpers/clock", "sk_test_sandbox_all"))
		var c struct {
			FrozenTime *string `json:"frozen_time"`
			Now        string  `json:"now"`
		}
		if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &c) != nil || c.FrozenTime != nil && *c.FrozenTime != c.Now || c.FrozenTime == nil && (c.Now == frozen || c.Now == past) {
			t.Errorf("GET clock while it moves = %d %s: two readings in one answer", rec.Code, rec.Body)
			return false
		}
		rec = httptest.NewRecorder()
		e.h.ServeHTTP(rec, newRequest(http.MethodGet, "/v1/orders", "sk_test_sandbox_expired"))
		if rec.Code == 200 && strings.Contains(rec.Body.String(), "ord_sbx_0001") {
			t.Errorf("sk_test_sandbox_expired read %s while the clock moved", rec.Body)
			return false
		}
		return true
	}, func() {
		for range 3000 {
			e.setClock(t, "sk_test_sandbox_all", past)
			e.setClock(t, "sk_test_sandbox_all", frozen)
			e.setClock(t, "sk_test_sandbox_all", "")
		}
	})
}

// TestRunWithClock: -clock (or SANDBOX_CLOCK) is the start instant: every clock starts
// frozen there and the moving shipment's events are placed after it.
func TestRunWithClock(t *testing.T) {
	t.Parallel()
	base, stdout, _, stop := startRun(t, "-clock", "2026-03-29T01:00:00Z")
	if !strings.Contains(stdout.String(), "Every sandbox clock is frozen at 2026-03-29T01:00:00Z (-clock)") {
		t.Errorf("the banner does not say the clocks are frozen:\n%s", stdout)
	}
	status, body := httpGet(t, base+"/test_helpers/clock", "Bearer sk_test_sandbox_none")
	if want := `{"frozen_time":"2026-03-29T01:00:00Z","running_from":null,"now":"2026-03-29T01:00:00Z","started_at":"2026-03-29T01:00:00Z"}`; status != 200 || body != want {
		t.Errorf("GET clock = %d %s, want %s", status, body, want)
	}
	_, body = httpGet(t, base+"/shipments/shp_sbx_moving/tracking", "Bearer sk_test_sandbox_all")
	if !strings.Contains(body, `"status":"pre_transit","events":[{"status":"pre_transit","description":"Label created","timestamp":"2026-03-29T01:00:00Z"`) || strings.Count(body, `"description"`) != 1 {
		t.Errorf("shp_sbx_moving at -clock = %s, want only its label at the start instant", body)
	}
	if _, body = httpGet(t, base+"/shipments/shp_sbx_spring/tracking", "Bearer sk_test_sandbox_all"); strings.Count(body, `"description"`) != 2 {
		t.Errorf("shp_sbx_spring at 01:00Z = %s, want its first two events", body)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// listAt is what GET /v1/orders query shows key at Prefer clock at (zero: the tenant's
// clock), as "id:status:shipment" items, walking every page of limit.
func (e *env) listAt(t testing.TB, key, query string, limit int, at time.Time) []string {
	t.Helper()
	var items []string
	cursor := ""
	for pages := 0; pages < 1000; pages++ {
		q := query + "&limit=" + strconv.Itoa(limit)
		if cursor != "" {
			q += "&cursor=" + url.QueryEscape(cursor)
		}
		var rep reply
		if at.IsZero() {
			rep = e.get(t, "/v1/orders?"+q, key)
		} else {
			rep = e.get(t, "/v1/orders?"+q, key, "Prefer", `clock="`+formatTimestamp(at)+`"`)
		}
		p := decodePage(t, rep)
		if p.Pagination.HasMore && len(p.Data) != limit {
			t.Fatalf("a page with more after it holds %d orders, limit %d", len(p.Data), limit)
		}
		for _, o := range p.Data {
			link := "-"
			if o.ShipmentID != nil {
				link = *o.ShipmentID
			}
			items = append(items, strings.TrimPrefix(o.ID, "ord_sync_")+":"+o.Status+":"+link)
		}
		if !p.Pagination.HasMore {
			return items
		}
		cursor = *p.Pagination.NextCursor
	}
	t.Fatal("the walk does not end")
	return nil
}

// TestSyncTenantWalkThrough: acct_sync at each instant of its table, its clock frozen
// there: which orders are listed, in which status and with which link, what GET by id and
// the tracking operations answer, and what each status filter lists.
func TestSyncTenantWalkThrough(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, step: -1})
	const key = "sk_test_sync_all"
	tests := []struct {
		after    time.Duration
		list     string
		hidden   []string // orders GET by id answers 404 for
		tracking string   // shp_sync_1's status and events shown, or 404
		statuses map[string]string
	}{
		{0, "0005:unfulfilled:- 0004:fulfilled:- 0003:unfulfilled:- 0001:unfulfilled:-", []string{"0002", "0006"}, "404",
			map[string]string{"unfulfilled": "0005 0003 0001", "fulfilled": "0004", "cancelled": "", "partially_fulfilled": ""}},
		{30*time.Second - time.Nanosecond, "0005:unfulfilled:- 0004:fulfilled:- 0003:unfulfilled:- 0001:unfulfilled:-", []string{"0002", "0006"}, "404", nil},
		{30 * time.Second, "0005:cancelled:- 0004:fulfilled:- 0003:unfulfilled:- 0001:unfulfilled:-", []string{"0002", "0006"}, "404",
			map[string]string{"unfulfilled": "0003 0001", "cancelled": "0005"}},
		{45 * time.Second, "0006:unfulfilled:- 0005:cancelled:- 0004:fulfilled:- 0003:unfulfilled:- 0001:unfulfilled:-", []string{"0002"}, "404", nil},
		{60*time.Second - time.Nanosecond, "0006:unfulfilled:- 0005:cancelled:- 0004:fulfilled:- 0003:unfulfilled:- 0001:unfulfilled:-", []string{"0002"}, "404", nil},
		{60 * time.Second, "0006:unfulfilled:- 0005:cancelled:- 0004:fulfilled:- 0003:unfulfilled:- 0001:partially_fulfilled:shp_sync_1", []string{"0002"}, "pre_transit 1",
			map[string]string{"unfulfilled": "0006 0003", "partially_fulfilled": "0001", "fulfilled": "0004", "cancelled": "0005"}},
		{90 * time.Second, "0006:unfulfilled:- 0005:cancelled:- 0004:fulfilled:- 0003:unfulfilled:- 0002:unfulfilled:- 0001:partially_fulfilled:shp_sync_1", nil, "pre_transit 1",
			map[string]string{"unfulfilled": "0006 0003 0002"}},
		{100 * time.Second, "0006:unfulfilled:- 0005:cancelled:- 0004:fulfilled:- 0003:unfulfilled:- 0002:unfulfilled:- 0001:partially_fulfilled:shp_sync_1", nil, "in_transit 2", nil},
		{120 * time.Second, "0006:unfulfilled:- 0005:cancelled:- 0004:fulfilled:- 0003:unfulfilled:- 0002:unfulfilled:- 0001:fulfilled:shp_sync_1", nil, "in_transit 2",
			map[string]string{"fulfilled": "0004 0001", "partially_fulfilled": ""}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint("start+", tt.after), func(t *testing.T) {
			at := testNow.Add(tt.after)
			e.setClock(t, key, formatTimestamp(at))
			for _, limit := range []int{1, 2, 100} {
				if got := strings.Join(e.listAt(t, key, "", limit, time.Time{}), " "); got != tt.list {
					t.Errorf("limit %d: the list is %s, want %s", limit, got, tt.list)
				}
			}
			for _, item := range strings.Fields(tt.list) {
				parts := strings.Split(item, ":")
				rep := e.get(t, "/v1/orders/ord_sync_"+parts[0], key)
				var o orderJSON
				if rep.status != 200 || json.Unmarshal(rep.body, &o) != nil || o.Status != parts[1] || (o.ShipmentID == nil) != (parts[2] == "-") {
					t.Errorf("GET ord_sync_%s = %s, want it as the list shows it: %s", parts[0], rep, item)
				}
			}
			for _, id := range tt.hidden {
				wantProblem(t, e.get(t, "/v1/orders/ord_sync_"+id, key), 404, "not_found", "")
			}
			for _, target := range []string{"/v1/shipments/shp_sync_1/tracking", "/v1/tracking/SYNC1000000001"} {
				rep := e.get(t, target, key)
				if tt.tracking == "404" {
					wantProblem(t, rep, 404, "not_found", "")
					continue
				}
				if n, status := eventsOf(t, rep); fmt.Sprint(status, " ", n) != tt.tracking {
					t.Errorf("%s shows %s with %d events, want %s", target, status, n, tt.tracking)
				}
			}
			for status, want := range tt.statuses {
				var got []string
				for _, item := range e.listAt(t, key, "status="+status, 1, time.Time{}) {
					got = append(got, strings.Split(item, ":")[0])
				}
				if strings.Join(got, " ") != want {
					t.Errorf("status=%s lists %v, want %s", status, got, want)
				}
			}
		})
	}
	// Order 0006 appears at the head of the list, so a created_from watermark sees it;
	// 0002 lands behind it.
	e.setClock(t, key, formatTimestamp(testNow))
	head := e.listAt(t, key, "", 100, time.Time{})[0]
	watermark := testNow.Add(-time.Minute) // 0005's created_at, the newest seen at the start
	if head != "0005:unfulfilled:-" {
		t.Fatalf("the head at the start is %s", head)
	}
	e.setClock(t, key, formatTimestamp(testNow.Add(2*time.Minute)))
	got := e.listAt(t, key, "created_from="+formatTimestamp(watermark), 100, time.Time{})
	if strings.Join(got, " ") != "0006:unfulfilled:- 0005:cancelled:-" {
		t.Errorf("polling from the watermark at +2m lists %v: want 0006 and 0005, and 0002 missed", got)
	}
}

// timelineJSON is GET /v1/test_helpers/timeline's answer as the tests read it.
type timelineJSON struct {
	Now   string `json:"now"`
	Shown []struct {
		At, Kind, ID string
		Status       *string
	} `json:"shown"`
	ShownMore int `json:"shown_more"`
	ToCome    []struct {
		At, Kind, ID string
		Status       *string
	} `json:"to_come"`
	ToComeMore int `json:"to_come_more"`
}

// TestTimelineAnswersAsThePageShows: a test steps its Prefer clock through acct_sync's
// timeline from one entry to the next, and at each instant the JSON holds what the page
// shows at a tenant clock frozen there: the same entries each side, the same counts.
func TestTimelineAnswersAsThePageShows(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, step: -1})
	const key = "sk_test_sync_all"
	rows := func(entries []struct {
		At, Kind, ID string
		Status       *string
	}) string {
		var b strings.Builder
		for _, en := range entries {
			at, _ := parseTimestamp(en.At)
			what := map[string]string{"creation": "created", "import": "imported, ", "change": "now ", "event": "tracking: "}[en.Kind]
			if en.Status != nil {
				what += *en.Status
			}
			fmt.Fprintf(&b, "<tr><td>%s<td>%s<td>%s\n", fromStart(at, testNow), en.ID, what)
		}
		return b.String()
	}
	steps := 0
	for at := "start-1h"; at != ""; steps++ {
		var tl timelineJSON
		rep := e.get(t, "/v1/test_helpers/timeline", key, "Prefer", `clock="`+at+`"`)
		if err := json.Unmarshal(rep.body, &tl); err != nil || rep.status != 200 {
			t.Fatalf("GET timeline at %s = %s", at, rep)
		}
		e.setClock(t, key, tl.Now)
		shown, toCome := timelineOnPage(t, string(e.get(t, "/", "").body), "acct_sync/test")
		if want := rows(tl.Shown); !strings.HasSuffix(strings.TrimSuffix(shown, "<tr>"), want) && want != "" || !strings.HasPrefix(toCome[strings.Index(toCome, "\n")+1:], rows(tl.ToCome)) {
			t.Errorf("at %s the JSON shows\n%sand has to come\n%sthe page shows\n%s\nand has to come\n%s", at, want, rows(tl.ToCome), shown, toCome)
		}
		if more := fmt.Sprintf("and %d more to come", tl.ToComeMore); tl.ToComeMore > 0 != strings.Contains(toCome, more) {
			t.Errorf("at %s the JSON has %d more to come; the page: %s", at, tl.ToComeMore, toCome)
		}
		at = ""
		if len(tl.ToCome) > 0 {
			at = tl.ToCome[0].At // the next scheduled instant
		}
	}
	if steps != 10 {
		t.Errorf("stepping through acct_sync's timeline took %d steps, want 10: one before it, then each of the 9 instants it schedules", steps)
	}
	// Any active key of the tenant, whatever its scopes; no query parameter; Prefer applies.
	if rep := e.get(t, "/v1/test_helpers/timeline", "sk_test_sandbox_none"); rep.status != 200 {
		t.Errorf("a key without scopes reads the timeline: %s, want 200", rep)
	}
	wantProblem(t, e.get(t, "/v1/test_helpers/timeline?from=start", key), 422, "unknown_parameter", "from")
	wantProblem(t, e.get(t, "/v1/test_helpers/timeline", key, "Prefer", "code=502"), 502, "provider_not_confirmed", "")
	wantProblem(t, e.get(t, "/v1/test_helpers/timeline", "sk_live_sandbox_all"), 503, "live_not_released", "")
	if rep := newEnv(t, envOptions{rate: -1, faults: "rate=1"}).get(t, "/v1/test_helpers/timeline", key); rep.status != 200 {
		t.Errorf("under -faults rate=1, the timeline = %s, want 200: test helpers are never faulted", rep)
	}
}

// TestTimelineRefusals: the dataset's schedule is checked at load; a bad instant, change or
// link refuses the dataset with its JSON path.
func TestTimelineRefusals(t *testing.T) {
	t.Parallel()
	order := func(members string) string {
		return `{"id":"ord_1","account":"acct_a","environment":"test","merchant_reference":"R1","platform":"ebay","status":"unfulfilled","created_at":"2026-11-01T00:00:00Z"` + members + `}`
	}
	created := func(at string) string { return strings.Replace(order(""), `"2026-11-01T00:00:00Z"`, `"`+at+`"`, 1) }
	shipment := func(members string) string {
		return `{"id":"shp_1","account":"acct_a","environment":"test","reference":"S","order_id":"ord_1"` + members + `}`
	}
	const notInstant = ` is not an instant: RFC 3339 with an offset (2026-11-01T09:30:00Z), or relative to the start instant (start, start+90s, start-10m, start+1h30m)`
	tests := []struct{ name, shipments, orders, want string }{
		{"start+0 without a unit", "", created("start+0"), `$.orders[0].created_at: "start+0"` + notInstant},
		{"a space", "", created("start + 90s"), `$.orders[0].created_at: "start + 90s"` + notInstant},
		{"upper case", "", created("START+90s"), `$.orders[0].created_at: "START+90s"` + notInstant},
		{"an upper-case unit", "", created("start+90S"), `$.orders[0].created_at: "start+90S"` + notInstant},
		{"a second sign", "", created("start+-5s"), `$.orders[0].created_at: "start+-5s"` + notInstant},
		{"a bare number", "", created("start+90"), `$.orders[0].created_at: "start+90"` + notInstant},
		{"a sign alone", "", created("start+"), `$.orders[0].created_at: "start+"` + notInstant},
		{"now", "", created("now"), `$.orders[0].created_at: "now"` + notInstant},
		{"past a duration", "", created("start+9999999999h"), `$.orders[0].created_at: "start+9999999999h" is an instant outside the years 0000 to 9999 in UTC, which RFC 3339 cannot write`},
		{"imported before created", "", order(`,"imported_at":"2026-10-31T23:59:59Z"`), `$.orders[0].imported_at: 2026-10-31T23:59:59Z is before the order's created_at 2026-11-01T00:00:00Z: an order is imported once it exists`},
		{"imported_at not an instant", "", order(`,"imported_at":"later"`), `$.orders[0].imported_at: "later"` + notInstant},
		{"imported_at a number", "", order(`,"imported_at":5`), `$.orders[0].imported_at: must be a string, not number`},
		{"a change to the same status", "", order(`,"changes":[{"status":"unfulfilled","at":"2026-11-02T00:00:00Z"}]`), `$.orders[0].changes[0].status: "unfulfilled" is the status the order has already: a change changes it`},
		{"a change to an unknown status", "", order(`,"changes":[{"status":"shipped","at":"2026-11-02T00:00:00Z"}]`), `$.orders[0].changes[0].status: unknown order status "shipped"; want one of unfulfilled, partially_fulfilled, fulfilled, cancelled`},
		{"a change at created_at", "", order(`,"changes":[{"status":"fulfilled","at":"2026-11-01T00:00:00Z"}]`), `$.orders[0].changes[0].at: 2026-11-01T00:00:00Z is not after the order's created_at 2026-11-01T00:00:00Z: changes follow each other`},
		{"changes out of order", "", order(`,"changes":[{"status":"fulfilled","at":"2026-11-03T00:00:00Z"},{"status":"cancelled","at":"2026-11-02T00:00:00Z"}]`), `$.orders[0].changes[1].at: 2026-11-02T00:00:00Z is not after the change before, 2026-11-03T00:00:00Z: changes follow each other`},
		{"two changes to one status", "", order(`,"changes":[{"status":"fulfilled","at":"2026-11-02T00:00:00Z"},{"status":"fulfilled","at":"2026-11-03T00:00:00Z"}]`), `$.orders[0].changes[1].status: "fulfilled" is the status the order has already: a change changes it`},
		{"a change without at", "", order(`,"changes":[{"status":"fulfilled"}]`), `$.orders[0].changes[0].at: "" is not an instant: RFC 3339 with an offset (2026-11-01T09:30:00Z), or relative to the start instant (start, start+90s, start-10m, start+1h30m)`},
		{"a change with another member", "", order(`,"changes":[{"status":"fulfilled","at":"2026-11-02T00:00:00Z","by":"x"}]`), `$.orders[0].changes[0].by: unknown field`},
		{"a change's member twice", "", order(`,"changes":[{"status":"fulfilled","Status":"cancelled","at":"2026-11-02T00:00:00Z"}]`), `$.orders[0].changes[0].Status: duplicate member: "status" is given already`},
		{"changes not a list", "", order(`,"changes":{"status":"fulfilled"}`), `$.orders[0].changes: must be an array, not object`},
		{"a shipment's created_at not an instant", shipment(`,"created_at":"soon"`), order(""), `$.shipments[0].created_at: "soon"` + notInstant},
		{"a link before the import", shipment(`,"created_at":"2026-11-01T12:00:00Z"`), order(`,"imported_at":"2026-11-02T00:00:00Z"`), `$.shipments[0].created_at: shipment "shp_1" is created at 2026-11-01T12:00:00Z, before its order "ord_1" is imported at 2026-11-02T00:00:00Z: a shipment is created with an order the account has`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadBytes("bad.json", []byte(dataset(dsAccounts, "", tt.shipments, tt.orders)), 0, testNow, slog.New(slog.DiscardHandler))
			if want := "dataset bad.json: " + tt.want; err == nil || err.Error() != want {
				t.Errorf("loadDataset = %v\nwant %s", err, want)
			}
		})
	}
	// What loads: every form of a relative instant, null and [] for no changes, a change
	// before the import, a link at the import, and rules judged once the start is known.
	for _, orders := range []string{
		created("start"), created("start+90s"), created("start-10m"), created("start+1h30m"), created("start+0s"), created("start+1.5h"), created("start+250ms"),
		created("start+1us"), created("start+1µs"), created("start+2h45m30.5s"), created("start-292h"),
		order(`,"changes":null`), order(`,"changes":[]`), order(`,"imported_at":null`),
		order(`,"imported_at":"2026-11-03T00:00:00Z","changes":[{"status":"fulfilled","at":"2026-11-02T00:00:00Z"}]`),
		order(`,"imported_at":"start-1s"`),
	} {
		if _, err := loadBytes("ok.json", []byte(dataset(dsAccounts, "", "", orders)), 0, testNow, slog.New(slog.DiscardHandler)); err != nil {
			t.Errorf("%s: %v, want it loaded", orders, err)
		}
	}
	if _, err := loadBytes("ok.json", []byte(dataset(dsAccounts, "", shipment(`,"created_at":"2026-11-02T00:00:00Z"`), order(`,"imported_at":"2026-11-02T00:00:00Z"`))), 0, testNow, slog.New(slog.DiscardHandler)); err != nil {
		t.Errorf("a shipment created as its order is imported: %v, want it loaded", err)
	}
	late := time.Date(9999, 6, 1, 0, 0, 0, 0, time.UTC)
	_, err := loadBytes("late.json", []byte(dataset(dsAccounts, "", "", created("start+8784h"))), 0, late, slog.New(slog.DiscardHandler))
	if want := `dataset late.json: $.orders[0].created_at: "start+8784h" is an instant outside the years 0000 to 9999 in UTC, which RFC 3339 cannot write`; err == nil || err.Error() != want {
		t.Errorf("a year past 9999 from a late start: %v, want %s", err, want)
	}
	mixed := dataset(dsAccounts, "", "", order(`,"imported_at":"start"`))
	if _, err := loadBytes("mixed.json", []byte(mixed), 0, time.Date(2026, 11, 2, 0, 0, 0, 0, time.UTC), slog.New(slog.DiscardHandler)); err != nil {
		t.Errorf("imported at a start after created_at: %v", err)
	}
	if _, err := loadBytes("mixed.json", []byte(mixed), 0, time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC), slog.New(slog.DiscardHandler)); err == nil {
		t.Error("imported at a start before created_at: loaded, want it refused")
	}
}

// TestDatasetShipmentCreatedAt: a dataset shipment's created_at (a booking's is its
// request's instant: TestBooking): before it the shipment is not found by id or number, and
// the order it was created with shows no link; a number is ambiguous only while two
// shipments found at that instant hold it.
func TestDatasetShipmentCreatedAt(t *testing.T) {
	t.Parallel()
	key := `{"key":"sk_test_a","account":"acct_a","environment":"test","scopes":["tracking:read","orders:read"]}`
	ship := func(id, number, created, orderID string) string {
		s := `{"id":"` + id + `","account":"acct_a","environment":"test","reference":"S","tracking_number":"` + number + `"`
		if created != "" {
			s += `,"created_at":"` + created + `"`
		}
		if orderID != "" {
			s += `,"order_id":"` + orderID + `"`
		}
		return s + `,"events":[{"timestamp":"2026-11-01T00:00:00Z","status":"in_transit","description":"Early scan"}]}`
	}
	data := dataset(dsAccounts, key, ship("shp_always", "T1", "", "")+","+ship("shp_later", "T1", "2026-11-05T00:00:00Z", "ord_1")+","+ship("shp_alone", "T2", "2026-11-05T00:00:00.5Z", ""), dsOrder)
	e := newEnv(t, envOptions{data: []byte(data), rate: -1, step: -1})
	for _, tt := range []struct {
		at                       string
		later, alone, byT1, byT2 int
		link                     string
	}{
		{"2026-11-04T23:59:59.999999999Z", 404, 404, 200, 404, "null"},
		{"2026-11-05T00:00:00Z", 200, 404, 404, 404, `"shp_later"`},
		{"2026-11-05T00:00:00.5Z", 200, 200, 404, 200, `"shp_later"`},
	} {
		e.setClock(t, "sk_test_a", tt.at)
		for target, want := range map[string]int{"/v1/shipments/shp_later/tracking": tt.later, "/v1/shipments/shp_alone/tracking": tt.alone,
			"/v1/tracking/T1": tt.byT1, "/v1/tracking/T2": tt.byT2, "/v1/shipments/shp_always/tracking": 200} {
			rep := e.get(t, target, "sk_test_a")
			if rep.status != want {
				t.Errorf("at %s GET %s = %s, want %d", tt.at, target, rep, want)
			}
			if want == 200 && strings.Contains(target, "shp_later") {
				if n, _ := eventsOf(t, rep); n != 1 {
					t.Errorf("a shipment found shows its events by their own instants: %d, want 1", n)
				}
			}
		}
		if rep := e.get(t, "/v1/orders/ord_1", "sk_test_a"); !strings.Contains(string(rep.body), `"shipment_id":`+tt.link) {
			t.Errorf("at %s ord_1 = %s, want shipment_id %s", tt.at, rep, tt.link)
		}
		if got := string(e.get(t, "/v1/tracking/T1", "sk_test_a").body); tt.byT1 == 200 && !strings.Contains(got, "shp_always") {
			t.Errorf("at %s T1 finds %s, want shp_always", tt.at, got)
		}
	}
}

// TestTheZeroInstantIsAnInstant: 0001-01-01T00:00:00Z, Go's zero time, is an instant like
// any other, not "not given": a key expires then, a shipment created then is not linked to
// a later order, and under a clock before it that shipment is not found yet.
func TestTheZeroInstantIsAnInstant(t *testing.T) {
	t.Parallel()
	const zero = "0001-01-01T00:00:00Z"
	key := `{"key":"sk_test_a","account":"acct_a","environment":"test","scopes":["tracking:read"],"expires_at":"` + zero + `"}`
	_, stdout, _, stop := startRun(t, "-data", writeTemp(t, dataset(dsAccounts, key, "", "")))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout.String(), "expired "+zero) {
		t.Errorf("the banner does not say the key expired at %s:\n%s", zero, stdout)
	}
	e := newEnv(t, envOptions{data: []byte(dataset(dsAccounts, key, dsShipment, "")), rate: -1})
	wantProblem(t, e.get(t, "/v1/shipments/shp_1/tracking", "sk_test_a"), 401, "expired_api_key", "")

	linked := `{"id":"shp_z","account":"acct_a","environment":"test","reference":"S","tracking_number":"T1","created_at":"` + zero + `","order_id":"ord_1"}`
	_, err := loadBytes("zero.json", []byte(dataset(dsAccounts, "", linked, dsOrder)), 0, testNow, slog.New(slog.DiscardHandler))
	if want := `dataset zero.json: $.shipments[0].created_at: shipment "shp_z" is created at 0001-01-01T00:00:00Z, before its order "ord_1" is imported at 2026-11-01T00:00:00Z: a shipment is created with an order the account has`; err == nil || err.Error() != want {
		t.Errorf("a shipment created at the zero instant, linked to a later order: %v, want %s", err, want)
	}

	// Under a clock before the zero instant, a shipment created then is not found, shares
	// no number, and the page counts what it shows.
	key = `{"key":"sk_test_a","account":"acct_a","environment":"test","scopes":["tracking:read"]}`
	created := strings.Replace(linked, `,"order_id":"ord_1"`, ``, 1)
	e = newEnv(t, envOptions{data: []byte(dataset(dsAccounts, key, dsShipment+","+created, "")), rate: -1, step: -1})
	e.setClock(t, "sk_test_a", "0000-06-01T00:00:00Z")
	wantProblem(t, e.get(t, "/v1/shipments/shp_z/tracking", "sk_test_a"), 404, "not_found", "")
	if rep := e.get(t, "/v1/tracking/T1", "sk_test_a"); rep.status != 200 || !strings.Contains(string(rep.body), `"shipment_id":"shp_1"`) {
		t.Errorf("GET /v1/tracking/T1 before shp_z exists = %s, want shp_1", rep)
	}
	page := string(e.get(t, "/", "").body)
	if strings.Contains(page, "<tr><td>shp_z<td>") || strings.Contains(page, "shared number \n") || strings.Contains(page, "and -") {
		t.Errorf("the page under a clock before the zero instant shows shp_z, a shared number or a negative count:\n%s", page)
	}
	e.setClock(t, "sk_test_a", zero)
	if rep := e.get(t, "/v1/tracking/T1", "sk_test_a"); rep.status != 404 {
		t.Errorf("GET /v1/tracking/T1 once shp_z exists = %s, want 404 (two shipments hold it)", rep)
	}
}

// movingDataset is n orders of acct_a/test, some imported late, some changing status, some
// linked to a shipment created later, from a seeded generator; start is the start instant.
func movingDataset(n int, seed uint64) string {
	rnd := rand.New(rand.NewPCG(seed, 1))
	base := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	var orders, shipments []string
	for i := range n {
		created := base.Add(time.Duration(rnd.IntN(3000)) * time.Minute / 10) // some share an instant
		status := rnd.IntN(len(orderStatuses))
		o := fmt.Sprintf(`{"id":"ord_%04d","account":"acct_a","environment":"test","merchant_reference":"R","platform":"ebay","status":%q,"created_at":%q`, i, orderStatuses[status], formatTimestamp(created))
		imported := created
		if rnd.IntN(4) == 0 {
			imported = created.Add(time.Duration(rnd.IntN(120)) * time.Minute)
			o += fmt.Sprintf(`,"imported_at":%q`, formatTimestamp(imported))
		}
		if rnd.IntN(3) == 0 {
			var changes []string
			at := created
			for range 1 + rnd.IntN(3) {
				at = at.Add(time.Duration(1+rnd.IntN(90)) * time.Minute)
				status = (status + 1 + rnd.IntN(len(orderStatuses)-1)) % len(orderStatuses)
				changes = append(changes, fmt.Sprintf(`{"status":%q,"at":%q}`, orderStatuses[status], formatTimestamp(at)))
			}
			o += `,"changes":[` + strings.Join(changes, ",") + `]`
		}
		orders = append(orders, o+"}")
		if rnd.IntN(5) == 0 {
			s := fmt.Sprintf(`{"id":"shp_%04d","account":"acct_a","environment":"test","reference":"S","order_id":"ord_%04d"`, i, i)
			if rnd.IntN(2) == 0 {
				s += fmt.Sprintf(`,"created_at":%q`, formatTimestamp(imported.Add(time.Duration(rnd.IntN(60))*time.Minute)))
			}
			shipments = append(shipments, s+"}")
		}
	}
	key := `{"key":"sk_test_a","account":"acct_a","environment":"test","scopes":["tracking:read","orders:read"]}`
	return dataset(dsAccounts, key, strings.Join(shipments, ","), strings.Join(orders, ","))
}

// modelChange is a change of a modelOrder's status.
type modelChange struct {
	at     time.Time
	status string
}

// modelOrder is an order of movingDataset as the rules say it shows.
type modelOrder struct {
	id, status string
	link       *string
	created    time.Time
	imported   time.Time
	changes    []modelChange
	linkedAt   time.Time
}

// TestPagesUnderAMovingTimeline: every list of a dataset whose orders move, at instants
// between their changes, walked with every limit and filter, is exactly the orders the
// rules show at that instant, newest first, each once, as GET by id shows it.
func TestPagesUnderAMovingTimeline(t *testing.T) {
	t.Parallel()
	data := movingDataset(400, 7)
	var raw struct { // read by encoding/json, apart from the sandbox's reader
		Orders []struct {
			ID         string  `json:"id"`
			Status     string  `json:"status"`
			CreatedAt  string  `json:"created_at"`
			ImportedAt *string `json:"imported_at"`
			Changes    []struct {
				Status string `json:"status"`
				At     string `json:"at"`
			} `json:"changes"`
		} `json:"orders"`
		Shipments []struct {
			ID        string  `json:"id"`
			OrderID   *string `json:"order_id"`
			CreatedAt *string `json:"created_at"`
		} `json:"shipments"`
	}
	if err := json.Unmarshal([]byte(data), &raw); err != nil {
		t.Fatal(err)
	}
	var model []modelOrder
	type link struct {
		id        string
		createdAt *string
	}
	links := map[string]link{}
	for _, s := range raw.Shipments {
		links[*s.OrderID] = link{s.ID, s.CreatedAt}
	}
	for _, r := range raw.Orders {
		m := modelOrder{id: r.ID, status: r.Status}
		m.created, _ = parseTimestamp(r.CreatedAt)
		m.imported = m.created
		if r.ImportedAt != nil {
			m.imported, _ = parseTimestamp(*r.ImportedAt)
		}
		for _, c := range r.Changes {
			at, _ := parseTimestamp(c.At)
			m.changes = append(m.changes, modelChange{at, c.Status})
		}
		if s, ok := links[r.ID]; ok {
			m.link = &s.id
			if s.createdAt != nil {
				m.linkedAt, _ = parseTimestamp(*s.createdAt)
			}
		}
		model = append(model, m)
	}
	slices.SortFunc(model, func(a, b modelOrder) int {
		if c := b.created.Compare(a.created); c != 0 {
			return c
		}
		return strings.Compare(b.id, a.id)
	})
	expect := func(at time.Time, status string, from, to *time.Time) []string {
		var items []string
		for _, m := range model {
			if m.imported.After(at) || from != nil && m.created.Before(*from) || to != nil && m.created.After(*to) {
				continue
			}
			s := m.status
			for _, c := range m.changes {
				if !c.at.After(at) {
					s = c.status
				}
			}
			if status != "" && s != status {
				continue
			}
			link := "-"
			if m.link != nil && (m.linkedAt.IsZero() || !m.linkedAt.After(at)) {
				link = *m.link
			}
			items = append(items, m.id+":"+s+":"+link)
		}
		return items
	}
	e := newEnv(t, envOptions{data: []byte(data), rate: -1, step: -1, quiet: true})
	from, to := time.Date(2026, 11, 1, 2, 0, 0, 0, time.UTC), time.Date(2026, 11, 1, 4, 30, 0, 0, time.UTC)
	for _, at := range []time.Time{
		time.Date(2026, 10, 31, 0, 0, 0, 0, time.UTC), time.Date(2026, 11, 1, 1, 7, 30, 0, time.UTC), time.Date(2026, 11, 1, 3, 0, 1, 0, time.UTC),
		time.Date(2026, 11, 1, 4, 44, 0, 0, time.UTC), time.Date(2026, 11, 1, 6, 0, 0, 0, time.UTC), time.Date(2026, 11, 3, 0, 0, 0, 0, time.UTC),
	} {
		e.setClock(t, "sk_test_a", formatTimestamp(at))
		for _, status := range append([]string{""}, orderStatuses...) {
			for _, limit := range []int{1, 7, 100} {
				for _, bounds := range []struct {
					query    string
					from, to *time.Time
				}{{"", nil, nil}, {"&created_from=" + formatTimestamp(from) + "&created_to=" + formatTimestamp(to), &from, &to}} {
					query := bounds.query
					if status != "" {
						query += "&status=" + status
					}
					got := e.listAt(t, "sk_test_a", query, limit, time.Time{})
					// listAt strips the ord_sync_ prefix only: these ids keep theirs.
					if want := expect(at, status, bounds.from, bounds.to); !slices.Equal(got, want) {
						i := firstDifference(got, want)
						t.Fatalf("at %s, %q, limit %d: %d orders, want %d; first difference at %d: %v, want %v", formatTimestamp(at), query, limit, len(got), len(want), i, got[i:min(len(got), i+1)], want[i:min(len(want), i+1)])
					}
				}
			}
		}
		// GET by id agrees with the list, and is 404 before the import.
		for _, m := range model {
			rep := e.get(t, "/v1/orders/"+m.id, "sk_test_a")
			want := expect(at, "", nil, nil)
			shown := slices.IndexFunc(want, func(item string) bool { return strings.HasPrefix(item, m.id+":") })
			if (rep.status == 200) != (shown >= 0) {
				t.Fatalf("at %s GET %s = %d, but the list shows it: %v", formatTimestamp(at), m.id, rep.status, shown >= 0)
			}
			if shown >= 0 {
				var o orderJSON
				mustDecode(t, rep.body, &o)
				link := "-"
				if o.ShipmentID != nil {
					link = *o.ShipmentID
				}
				if got := o.ID + ":" + o.Status + ":" + link; got != want[shown] {
					t.Fatalf("at %s GET %s = %s, the list shows %s", formatTimestamp(at), m.id, got, want[shown])
				}
			}
		}
	}
	// A cursor holds a position, not a state: a page walk whose clock moves between pages
	// neither repeats nor skips an order it shows at each page's instant.
	e.setClock(t, "sk_test_a", "2026-11-01T03:00:00Z")
	p := decodePage(t, e.get(t, "/v1/orders?limit=50", "sk_test_a"))
	e.setClock(t, "sk_test_a", "2026-11-03T00:00:00Z")
	var rest []string
	for cursor := p.Pagination.NextCursor; cursor != nil; {
		next := decodePage(t, e.get(t, "/v1/orders?limit=50&cursor="+url.QueryEscape(*cursor), "sk_test_a"))
		for _, o := range next.Data {
			link := "-"
			if o.ShipmentID != nil {
				link = *o.ShipmentID
			}
			rest = append(rest, o.ID+":"+o.Status+":"+link)
		}
		cursor = next.Pagination.NextCursor
	}
	last := p.Data[len(p.Data)-1]
	var want []string
	for _, item := range expect(time.Date(2026, 11, 3, 0, 0, 0, 0, time.UTC), "", nil, nil) {
		id := strings.Split(item, ":")[0]
		m := model[slices.IndexFunc(model, func(m modelOrder) bool { return m.id == id })]
		lastCreated, _ := parseTimestamp(last.CreatedAt)
		if c := m.created.Compare(lastCreated); c < 0 || c == 0 && id < last.ID {
			want = append(want, item)
		}
	}
	if !slices.Equal(rest, want) {
		t.Errorf("the pages after a cursor under a moved clock: %d orders, want %d", len(rest), len(want))
	}
}

// BenchmarkClock: the same reads with the tenant's clock frozen in the middle of the data
// (3 of shp_sbx_spring's 5 events; half of the orders), against the wall clock.
func BenchmarkClock(b *testing.B) {
	for _, frozen := range []bool{false, true} {
		e := benchEnv(b, 1000000)
		ix := &e.sb.tenants.byID[seedTenant].current().orders
		if frozen {
			at := ix.createdAt(ix.count() / 2)
			e.sb.tenants.byID[seedTenant].clock.freeze(at)
			shp := e.sb.tenants.byID[seedTenant].current().shipments.find("shp_sbx_spring")
			// The tracking read is measured with the clock at the third event.
			b.Run("frozen/tracking_by_id", func(b *testing.B) {
				e.sb.tenants.byID[seedTenant].clock.freeze(shp.instants[2].time())
				benchServe(b, e.h, newRequest("GET", "/v1/shipments/shp_sbx_spring/tracking", "sk_test_sandbox_all"), 200)
				e.sb.tenants.byID[seedTenant].clock.freeze(at)
			})
			b.Run("frozen/list_orders", func(b *testing.B) {
				benchServe(b, e.h, newRequest("GET", "/v1/orders?limit=100", "sk_test_sandbox_all"), 200)
			})
			continue
		}
		b.Run("wall/tracking_by_id", func(b *testing.B) {
			benchServe(b, e.h, newRequest("GET", "/v1/shipments/shp_sbx_spring/tracking", "sk_test_sandbox_all"), 200)
		})
		b.Run("wall/list_orders", func(b *testing.B) {
			benchServe(b, e.h, newRequest("GET", "/v1/orders?limit=100", "sk_test_sandbox_all"), 200)
		})
	}
}

// ===== auth.go: The journal, its reads, the findings, the journal as HAR =====

// auth.go, the journal: what is journaled and how, its reads, its bounds, and the findings
// it holds, each both ways.

// The answers' shapes as the contract writes them, the tests' own copies of auth.go's
// (entryJSON and the rest), decoded strictly: a member renamed, added or dropped there fails
// here.
type (
	entryOut struct {
		Seq            uint64   `json:"seq"`
		At             string   `json:"at"`
		Clock          string   `json:"clock"`
		Method         string   `json:"method"`
		Route          string   `json:"route"`
		Target         string   `json:"target"`
		Key            string   `json:"key"`
		Status         int      `json:"status"`
		Code           *string  `json:"code"`
		Simulated      *string  `json:"simulated"`
		RequestID      string   `json:"request_id"`
		DurationMS     float64  `json:"duration_ms"`
		Prefer         *string  `json:"prefer"`
		RetryAfter     *int     `json:"retry_after"`
		IDs            []string `json:"ids"`
		IdempotencyKey *string  `json:"idempotency_key"`
		Repeats        *int32   `json:"repeats"`
	}
	requestsOut struct {
		Data    []entryOut `json:"data"`
		HasMore bool       `json:"has_more"`
		LastSeq uint64     `json:"last_seq"`
		Dropped uint64     `json:"dropped"`
	}
	findingOut struct {
		Code     string   `json:"code"`
		Detail   string   `json:"detail"`
		Requests []uint64 `json:"requests"`
		ID       *string  `json:"id"`
	}
	findingsOut struct {
		Data   []findingOut `json:"data"`
		More   int          `json:"more"`
		Judged *struct {
			From uint64 `json:"from_seq"`
			To   uint64 `json:"to_seq"`
		} `json:"judged"`
		Dropped uint64 `json:"dropped"`
	}
)

// strict decodes a 200 answer into v, refusing members v does not know.
func strict(t testing.TB, rep reply, v any) {
	t.Helper()
	if rep.status != 200 {
		t.Fatalf("answered %s, want 200", rep)
	}
	mustDecodeExact(t, rep.body, v)
}

// journalOf reads the journal of key's tenant with this query.
func (e *env) journalOf(t testing.TB, key, query string) requestsOut {
	t.Helper()
	var out requestsOut
	strict(t, e.get(t, "/v1/test_helpers/requests?"+query, key), &out)
	return out
}

// findingsOf reads the findings of key's tenant with this query.
func (e *env) findingsOf(t testing.TB, key, query string) findingsOut {
	t.Helper()
	var out findingsOut
	strict(t, e.get(t, "/v1/test_helpers/findings?"+query, key), &out)
	return out
}

// summary is the findings as code, id and cited seqs, one line each.
func (f findingsOut) summary() string {
	var lines []string
	for _, x := range f.Data {
		id := "-"
		if x.ID != nil {
			id = *x.ID
		}
		lines = append(lines, fmt.Sprintf("%s %s %v", x.Code, id, x.Requests))
	}
	return strings.Join(lines, "\n")
}

// TestJournalEntries: every request that reaches the key check with a key of a test
// environment's dataset is journaled, whatever the key's state, member for member; no other
// request is.
func TestJournalEntries(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{step: -1, rate: -1})
	before := time.Now()
	type sent struct {
		method, target, key, prefer, body string
		want                              entryOut
	}
	str := func(s string) *string { return &s }
	one := 1
	journaled := []sent{
		{"GET", "/v1/orders?limit=2", "sk_test_sandbox_all", "", "", entryOut{Route: "/v1/orders", Key: "..._all", Status: 200, IDs: []string{"ord_sbx_0001"}}},
		{"HEAD", "/v1/orders/ord_sbx_0001", "sk_test_sandbox_all", "", "", entryOut{Route: "/v1/orders/{id}", Key: "..._all", Status: 200, IDs: []string{}}},
		{"GET", "/v1/orders/ord_sbx_0001", "sk_test_sandbox_orders", "", "", entryOut{Route: "/v1/orders/{id}", Key: "...ders", Status: 200, IDs: []string{"ord_sbx_0001"}}},
		{"GET", "/v1/tracking/SBX4000000001", "sk_test_sandbox_tracking", "", "", entryOut{Route: "/v1/tracking/{tracking_number}", Key: "sk_test_...king", Status: 200, IDs: []string{"shp_sbx_moving"}}},
		{"GET", "/v1/shipments/shp_sbx_twin_a/tracking", "sk_test_sandbox_all", `run="t-1"`, "", entryOut{Route: "/v1/shipments/{id}/tracking", Key: "..._all", Status: 200, Prefer: str(`run="t-1"`), IDs: []string{"shp_sbx_twin_a"}}},
		{"GET", "/v1/orders/ord_nope", "sk_test_sandbox_all", "", "", entryOut{Route: "/v1/orders/{id}", Key: "..._all", Status: 404, Code: str("not_found"), IDs: []string{}}},
		{"GET", "/v1/orders?limit=0", "sk_test_sandbox_all", "", "", entryOut{Route: "/v1/orders", Key: "..._all", Status: 422, Code: str("invalid_parameter"), IDs: []string{}}},
		{"GET", "/v1/orders", "sk_test_sandbox_expired", "", "", entryOut{Route: "/v1/orders", Key: "...ired", Status: 401, Code: str("expired_api_key"), IDs: []string{}}},
		{"GET", "/v1/orders", "sk_test_sandbox_revoked", "", "", entryOut{Route: "/v1/orders", Key: "...oked", Status: 401, Code: str("revoked_api_key"), IDs: []string{}}},
		{"GET", "/v1/orders", "sk_test_sandbox_none", "", "", entryOut{Route: "/v1/orders", Key: "...none", Status: 403, Code: str("insufficient_scope"), IDs: []string{}}},
		{"GET", "/v1/orders/ord_sbx_0001", "sk_test_sandbox_all", "code=503", "", entryOut{Route: "/v1/orders/{id}", Key: "..._all", Status: 503, Code: str("provider_unavailable"), Simulated: str("prefer"), Prefer: str("code=503"), RetryAfter: &one, IDs: []string{}}},
		{"GET", "/v1/test_helpers/clock", "sk_test_sandbox_none", "", "", entryOut{Route: "/v1/test_helpers/clock", Key: "...none", Status: 200, IDs: []string{}}},
		{"POST", "/v1/test_helpers/clock", "sk_test_sandbox_all", "", `{"frozen_time":null}`, entryOut{Route: "/v1/test_helpers/clock", Key: "..._all", Status: 200, IDs: []string{}}},
		{"GET", "/v1/test_helpers/timeline?x=1", "sk_test_sandbox_all", "", "", entryOut{Route: "/v1/test_helpers/timeline", Key: "..._all", Status: 422, Code: str("unknown_parameter"), IDs: []string{}}},
	}
	unjournaled := []sent{
		{method: "GET", target: "/v1/orders", key: "sk_test_nope"},
		{method: "GET", target: "/v1/orders"},
		{method: "GET", target: "/v1/orders", key: "sk_live_sandbox_all"},
		{method: "DELETE", target: "/v1/orders", key: "sk_test_sandbox_all"},
		{method: "GET", target: "/v1/nope", key: "sk_test_sandbox_all"},
		{method: "GET", target: "/v1/healthz", key: "sk_test_sandbox_all"},
		{method: "GET", target: "/v1/openapi.json", key: "sk_test_sandbox_all"},
		{method: "GET", target: "/", key: "sk_test_sandbox_all"},
		{method: "GET", target: "/v1/test_helpers/requests", key: "sk_test_sandbox_all"},
		{method: "GET", target: "/v1/test_helpers/findings", key: "sk_test_sandbox_all"},
	}
	send := func(s sent) reply {
		r := newBodyRequest(s.method, s.target, s.key, s.body)
		if s.prefer != "" {
			r.Header.Set("Prefer", s.prefer)
		}
		r.RequestURI = s.target // as a server reads it off the request line
		return e.do(t, r)
	}
	var ids []string
	for i, s := range journaled {
		ids = append(ids, send(s).header.Get("Request-Id"))
		send(unjournaled[i%len(unjournaled)])
	}
	got := e.journalOf(t, "sk_test_sandbox_all", "")
	if got.LastSeq != uint64(len(journaled)) || got.HasMore || got.Dropped != 0 || len(got.Data) != len(journaled) {
		t.Fatalf("last_seq %d, has_more %v, dropped %d, %d entries; want %d entries, nothing more or dropped", got.LastSeq, got.HasMore, got.Dropped, len(got.Data), len(journaled))
	}
	for i, s := range journaled {
		g, w := got.Data[i], s.want
		w.Seq, w.Method, w.Target, w.Clock, w.RequestID = uint64(i+1), s.method, s.target, formatTimestamp(testNow), ids[i]
		at, err := time.Parse(time.RFC3339Nano, g.At)
		if err != nil || at.Before(before) || at.After(time.Now()) || !strings.HasSuffix(g.At, "Z") || g.DurationMS < 0 {
			t.Errorf("entry %d: at %q, duration_ms %v: want the UTC instant it arrived, during the test", i+1, g.At, g.DurationMS)
		}
		w.At, w.DurationMS = g.At, g.DurationMS
		if !reflect.DeepEqual(g, w) {
			t.Errorf("entry %d is\n%+v\nwant\n%+v", i+1, g, w)
		}
	}
	if other := e.journalOf(t, "sk_test_other_all", ""); len(other.Data) != 0 || other.LastSeq != 0 {
		t.Errorf("acct_other's journal holds %+v, want nothing: the journal is a tenant's", other)
	}
	if e.sb.tenants.byID[tenantID{"acct_sync", "test"}].heldJournal() != nil {
		t.Error("a tenant never called holds a journal")
	}
	// A request's Prefer clock is the entry's clock; HAR and JSON keep the target as sent.
	e.get(t, "/v1/orders/ord_sbx_0001?", "sk_test_sandbox_all", "Prefer", `clock="2026-10-01T00:00:00Z"`)
	last := e.journalOf(t, "sk_test_sandbox_all", "after=14").Data
	if len(last) != 1 || last[0].Clock != "2026-10-01T00:00:00Z" || last[0].Status != 404 || last[0].Target != "/v1/orders/ord_sbx_0001?" {
		t.Errorf("a request at Prefer clock 2026-10-01 is journaled as %+v", last)
	}
	// A long target is cut at 1,024 bytes and a long Prefer at 256, as log values are; the
	// run is read from the whole field.
	target := "/v1/orders?" + strings.Repeat("a", 2000)
	e.get(t, target, "sk_test_sandbox_all", "Prefer", strings.Repeat("x=aaaaaaaaaaaaaaaaaa, ", 14)+"delay=0", "Prefer", `run="late"`) // the run past byte 256
	cut := e.journalOf(t, "sk_test_sandbox_all", "run=late").Data
	if len(cut) != 1 || cut[0].Target != target[:1021]+"..." || cut[0].Prefer == nil || len(*cut[0].Prefer) != 256 || !strings.HasSuffix(*cut[0].Prefer, "...") {
		t.Errorf("a long target and Prefer are journaled as %+v", cut)
	}
}

// TestJournalReads: the reads' access, parameters and faults, in the contract's order;
// -journal 0 turns both to a 404 that names the flag, and journals nothing.
func TestJournalReads(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1})
	key := "sk_test_sandbox_all"
	for range 5 {
		e.get(t, "/v1/orders", key)
	}
	e.get(t, "/v1/orders", key, "Prefer", `run="mine"`)
	for _, tt := range []struct {
		query   string
		seqs    []uint64
		hasMore bool
	}{
		{"", []uint64{1, 2, 3, 4, 5, 6}, false},
		{"limit=2", []uint64{1, 2}, true},
		{"after=2&limit=4", []uint64{3, 4, 5, 6}, false},
		{"after=0005", []uint64{6}, false},
		{"after=6", nil, false},
		{"after=18446744073709551615", nil, false},
		{"run=mine", []uint64{6}, false},
		{"run=other", nil, false},
		{"limit=1000&format=json", []uint64{1, 2, 3, 4, 5, 6}, false},
	} {
		got := e.journalOf(t, key, tt.query)
		var seqs []uint64
		for _, x := range got.Data {
			seqs = append(seqs, x.Seq)
		}
		if !slices.Equal(seqs, tt.seqs) || got.HasMore != tt.hasMore || got.LastSeq != 6 {
			t.Errorf("?%s: seqs %v, has_more %v, last_seq %d; want %v, %v, 6", tt.query, seqs, got.HasMore, got.LastSeq, tt.seqs, tt.hasMore)
		}
	}
	for _, tt := range []struct {
		target, code, param string
	}{
		{"/v1/test_helpers/requests?since=1", "unknown_parameter", "since"},
		{"/v1/test_helpers/requests?after=1&after=2", "invalid_parameter", "after"},
		{"/v1/test_helpers/requests?after=-1", "invalid_parameter", "after"},
		{"/v1/test_helpers/requests?after=%2B1", "invalid_parameter", "after"},
		{"/v1/test_helpers/requests?after=", "invalid_parameter", "after"},
		{"/v1/test_helpers/requests?after=18446744073709551616", "invalid_parameter", "after"},
		{"/v1/test_helpers/requests?limit=0", "invalid_parameter", "limit"},
		{"/v1/test_helpers/requests?limit=1001", "invalid_parameter", "limit"},
		{"/v1/test_helpers/requests?run=a%20b", "invalid_parameter", "run"},
		{"/v1/test_helpers/requests?run=" + strings.Repeat("a", 65), "invalid_parameter", "run"},
		{"/v1/test_helpers/requests?format=xml", "invalid_parameter", "format"},
		{"/v1/test_helpers/requests?limit=x&foo=1", "invalid_parameter", "limit"},
		{"/v1/test_helpers/requests?foo=1&limit=x", "unknown_parameter", "foo"},
		{"/v1/test_helpers/findings?limit=1", "unknown_parameter", "limit"},
		{"/v1/test_helpers/findings?format=har", "unknown_parameter", "format"},
		{"/v1/test_helpers/findings?after=x", "invalid_parameter", "after"},
		{"/v1/test_helpers/findings?run=", "invalid_parameter", "run"},
	} {
		wantProblem(t, e.get(t, tt.target, key), 422, tt.code, tt.param)
	}
	for _, route := range []string{"/v1/test_helpers/requests", "/v1/test_helpers/findings"} {
		wantProblem(t, e.get(t, route, ""), 401, "missing_api_key", "")
		wantProblem(t, e.get(t, route, "sk_test_sandbox_revoked"), 401, "revoked_api_key", "")
		wantProblem(t, e.get(t, route, "sk_test_sandbox_expired"), 401, "expired_api_key", "")
		wantProblem(t, e.get(t, route, "sk_live_sandbox_all"), 503, "live_not_released", "")
		wantProblem(t, e.get(t, route, key, "Prefer", "code=500"), 500, "internal_error", "")
		wantProblem(t, e.get(t, route, key, "Prefer", `run="a b"`), 422, "invalid_parameter", "Prefer")
		wantProblem(t, e.get(t, route+"?foo=1", key, "Prefer", "code=502"), 502, "provider_not_confirmed", "")
		if rep := e.get(t, route, "sk_test_sandbox_none", "Prefer", `clock="start", delay=1`); rep.status != 200 || rep.header.Get("Preference-Applied") != "delay=1" {
			t.Errorf("%s with a key without scopes and Prefer clock and delay = %s, Preference-Applied %q: want 200, delay=1 applied, clock not read", route, rep, rep.header.Get("Preference-Applied"))
		}
		if rep := e.do(t, newRequest(http.MethodHead, route, key)); rep.status != 200 {
			t.Errorf("HEAD %s = %s, want 200", route, rep)
		}
	}
	if got := e.journalOf(t, key, ""); got.LastSeq != 6 {
		t.Errorf("last_seq %d after reading the journal, want 6: its reads are not journaled", got.LastSeq)
	}
	off := newEnv(t, envOptions{journal: -1})
	off.get(t, "/v1/orders", key)
	for _, route := range []string{"/v1/test_helpers/requests", "/v1/test_helpers/findings"} {
		if p := wantProblem(t, off.get(t, route+"?after=x", key), 404, "not_found", ""); !strings.Contains(p.Detail, "-journal") {
			t.Errorf("with -journal 0, %s answers %q, which does not name the flag", route, p.Detail)
		}
	}
	if off.sb.tenants.byID[seedTenant].heldJournal() != nil {
		t.Error("with -journal 0 a request was journaled")
	}
}

// TestJournalRingWrapsAndCountsWhatItDropped: a tenant keeps its last -journal entries;
// dropped counts those after the read's seq that are gone.
func TestJournalRingWrapsAndCountsWhatItDropped(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{journal: 3, rate: -1})
	key := "sk_test_sandbox_all"
	for range 7 {
		e.get(t, "/v1/orders/ord_sbx_0001", key)
	}
	for _, tt := range []struct {
		after         string
		seqs          []uint64
		dropped, more int
	}{
		{"0", []uint64{5, 6, 7}, 4, 0},
		{"3", []uint64{5, 6, 7}, 1, 0},
		{"4", []uint64{5, 6, 7}, 0, 0},
		{"6", []uint64{7}, 0, 0},
		{"9", nil, 0, 0},
	} {
		got := e.journalOf(t, key, "after="+tt.after)
		var seqs []uint64
		for _, x := range got.Data {
			seqs = append(seqs, x.Seq)
		}
		if !slices.Equal(seqs, tt.seqs) || got.Dropped != uint64(tt.dropped) || got.LastSeq != 7 {
			t.Errorf("after=%s: seqs %v, dropped %d, last_seq %d; want %v, %d, 7", tt.after, seqs, got.Dropped, got.LastSeq, tt.seqs, tt.dropped)
		}
		if f := e.findingsOf(t, key, "after="+tt.after); f.Dropped != uint64(tt.dropped) || len(tt.seqs) > 0 && (f.Judged == nil || f.Judged.From != tt.seqs[0] || f.Judged.To != 7) || len(tt.seqs) == 0 && f.Judged != nil {
			t.Errorf("findings after=%s: judged %+v, dropped %d; want from %v to 7, dropped %d", tt.after, f.Judged, f.Dropped, tt.seqs, tt.dropped)
		}
	}
	if j := e.sb.tenants.byID[seedTenant].heldJournal(); len(j.ring) != 3 {
		t.Errorf("a journal of -journal 3 holds a ring of %d", len(j.ring))
	}
}

// TestJournalsShareTheirBound: past the bytes all journals may hold, the oldest entries of
// the largest go first, counted in its dropped; the bound holds after every entry.
func TestJournalsShareTheirBound(t *testing.T) {
	t.Parallel()
	const bound = 64 << 10
	e := newEnv(t, envOptions{journalBytes: bound, rate: -1, quiet: true})
	book := e.srv.registry
	// At least 400 entries, and on until the room left is under half what the journal
	// holds (a shed frees a quarter, and the ring's empty slots: the room left varies).
	roomFor := func() int { return int((bound-book.journalTotal.Load())/(entrySlot+64)) + 10 }
	n := 0
	for ; n < 400 || n < 2000 && roomFor() > e.sb.tenants.byID[seedTenant].heldJournal().n/2; n++ {
		e.get(t, "/v1/orders/ord_sbx_0001?pad="+strings.Repeat("x", n%50), "sk_test_sandbox_all")
		if book.journalTotal.Load() > bound {
			t.Fatalf("after %d entries the journals hold %d bytes, over their bound of %d", n+1, book.journalTotal.Load(), bound)
		}
	}
	big := e.journalOf(t, "sk_test_sandbox_all", "limit=1000")
	if big.Dropped == 0 || big.LastSeq != uint64(n) || uint64(len(big.Data))+big.Dropped != uint64(n) || big.Data[len(big.Data)-1].Seq != uint64(n) {
		t.Fatalf("one tenant past the bound: %d held, %d dropped, last_seq %d; want the newest kept and the rest counted", len(big.Data), big.Dropped, big.LastSeq)
	}
	// More entries than the room left (its ring's slots counted at their least), fewer than
	// the largest holds: the rest of their room is taken from the largest.
	others := roomFor()
	if others > len(big.Data)/2 {
		t.Fatalf("the arrangement: %d entries for the other tenant, the largest holds %d", others, len(big.Data))
	}
	for range others { // another tenant takes room from the largest, not from itself
		e.get(t, "/v1/orders/ord_other_0001", "sk_test_other_all")
	}
	if other := e.journalOf(t, "sk_test_other_all", ""); other.Dropped != 0 || len(other.Data) != others {
		t.Errorf("the smaller journal dropped %d of its %d", other.Dropped, others)
	}
	if now := e.journalOf(t, "sk_test_sandbox_all", "limit=1000"); now.Dropped <= big.Dropped {
		t.Errorf("the largest journal dropped %d, then %d: the room the other took was not its", big.Dropped, now.Dropped)
	}
	var held int64
	for _, tn := range e.sb.tenants.list {
		held += tn.journalBytes.Load()
	}
	if held != book.journalTotal.Load() || held > bound {
		t.Errorf("the journals hold %d bytes by their own counts, %d by the book's, bound %d", held, book.journalTotal.Load(), bound)
	}
}

// TestJournalMemoryOf40000Tenants: one request in each of 40,000 tenants, a limit=100 page
// with a target under 128 bytes, costs each at most 1 KiB, measured on the heap. Not
// parallel: it measures the heap.
func TestJournalMemoryOf40000Tenants(t *testing.T) {
	const n = 40000
	e := newEnv(t, envOptions{data: pageDataset(n, 1, 0, 0, 12, "x"), quiet: true, rate: -1})
	var reqs []*http.Request
	for _, k := range e.sb.keyLines {
		reqs = append(reqs, newRequest(http.MethodGet, "/v1/orders?limit=100&created_from=2026-01-01T00:00:00Z", k.key))
	}
	per := heapGrowth(t, e.h, len(reqs), 200, func(i int) *http.Request { return reqs[i] }) / n
	t.Logf("%d bytes a tenant; the book counts %d", per, e.srv.registry.journalTotal.Load()/n)
	if per > 1024 {
		t.Errorf("a tenant's one journaled request holds %d bytes of heap, want at most 1 KiB", per)
	}
	runtime.KeepAlive(reqs)
}

// TestJournalsHoldTheirBoundOnTheHeap: the worst entries for the bytes bound, requests as
// net/http reads them off a connection with a target and a Prefer near the header limit
// (each cut in its entry), fill journals bounded at 1 MiB: what the journals keep on the
// heap stays within the bound, not only by the registry's count (a method that pinned the
// request line it was cut from held 60 KiB an entry). Not parallel: it measures the heap.
func TestJournalsHoldTheirBoundOnTheHeap(t *testing.T) {
	const bound, n = 1 << 20, 3000
	e := newEnv(t, envOptions{journalBytes: bound, journal: maxJournal, rate: -1, quiet: true})
	pad := strings.Repeat("x", 60<<10)
	held := heapGrowth(t, e.h, n, http.StatusUnprocessableEntity, func(i int) *http.Request { // an unknown parameter
		return readRequest(t, fmt.Sprintf("GET /v1/orders/ord_sbx_0001?pad%d=%s HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nAuthorization: Bearer sk_test_sandbox_all\r\nPrefer: run=\"r%d\", x=%s\r\n\r\n", i, pad, i, pad))
	})
	t.Logf("the journals hold %d bytes of heap; the book counts %d", held, e.srv.registry.journalTotal.Load())
	if got := e.journalOf(t, "sk_test_sandbox_all", "limit=1"); got.LastSeq != n || got.Dropped == 0 {
		t.Fatalf("last_seq %d, dropped %d: want %d journaled and some dropped", got.LastSeq, got.Dropped, n)
	}
	if held > bound+bound/4 {
		t.Errorf("journals bounded at %d bytes hold %d bytes of heap", bound, held)
	}
}

// TestJournalUnderParallelWritersAndReaders: requests and reads at once on one tenant
// (run with -race): every request is journaled once, the seqs consecutive.
func TestJournalUnderParallelWritersAndReaders(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, quiet: true, journal: 100})
	const writers, each = 6, 150
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				target := []string{"/v1/orders?limit=100", "/v1/orders/ord_sbx_0001", "/v1/tracking/SBX2000000000"}[(w+i)%3]
				e.h.ServeHTTP(httptest.NewRecorder(), newRequest("GET", target, "sk_test_sandbox_all"))
			}
		}()
	}
	var readers sync.WaitGroup
	for _, target := range []string{"/v1/test_helpers/requests?limit=1000", "/v1/test_helpers/findings", "/v1/test_helpers/requests?format=har", "/"} {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				rec := httptest.NewRecorder()
				e.h.ServeHTTP(rec, newRequest("GET", target, "sk_test_sandbox_all"))
				if rec.Code != 200 {
					t.Errorf("%s = %d during writes", target, rec.Code)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	readers.Wait()
	got := e.journalOf(t, "sk_test_sandbox_all", "limit=1000")
	if got.LastSeq != writers*each || len(got.Data) != 100 || got.Dropped != writers*each-100 {
		t.Fatalf("last_seq %d, %d held, %d dropped; want %d, 100, %d", got.LastSeq, len(got.Data), got.Dropped, writers*each, writers*each-100)
	}
	for i, x := range got.Data {
		if x.Seq != got.LastSeq-99+uint64(i) {
			t.Fatalf("entry %d has seq %d: the seqs are not consecutive", i, x.Seq)
		}
	}
}

// TestJournalEntryIsWrittenBeforeTheBody: a client that has its answer's headers finds its
// entry (the first byte of a body finds it written); one that goes away during a delay is
// journaled 499.
func TestJournalEntryIsWrittenBeforeTheBody(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1})
	tn := e.sb.tenants.byID[seedTenant]
	for i, target := range []string{"/v1/orders?limit=100", "/v1/orders/ord_sbx_0001", "/v1/tracking/SBX2000000000", "/v1/test_helpers/clock"} {
		found := false
		w := &bodyWatcher{ResponseWriter: httptest.NewRecorder(), first: func() {
			part := tn.journalPart(journalRead{after: uint64(i)})
			found = len(part.entries) == 1 && part.entries[0].target == target
		}}
		r := newRequest("GET", target, "sk_test_sandbox_all")
		r.RequestURI = target
		e.h.ServeHTTP(w, r)
		if !found {
			t.Errorf("GET %s: its entry was not written when its body began", target)
		}
	}
	arrived := make(chan struct{}) // the client goes once the sandbox has its request, not after a guessed time
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		e.h.ServeHTTP(w, r)
	}))
	defer ts.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, _ := http.NewRequestWithContext(ctx, "GET", ts.URL+"/v1/orders/ord_sbx_0001", nil)
	r.Header.Set("Authorization", "Bearer sk_test_sandbox_all")
	r.Header.Set("Prefer", "delay=5000")
	answered := make(chan error, 1)
	go func() {
		_, err := ts.Client().Do(r)
		answered <- err
	}()
	<-arrived
	cancel()
	if err := <-answered; err == nil {
		t.Fatal("a request cancelled during its delay was answered")
	}
	var gone entryOut
	waitFor(t, "the gone client's entry", func() bool {
		got := e.journalOf(t, "sk_test_sandbox_all", "after=4")
		if len(got.Data) == 1 {
			gone = got.Data[0]
		}
		return len(got.Data) == 1
	})
	har := e.get(t, "/v1/test_helpers/requests?format=har&after=4", "sk_test_sandbox_all").body
	if !bytes.Contains(har, []byte(`"status":499,"statusText":"Client Closed Request"`)) || !bytes.Contains(har, []byte(`"content":{"size":-1,"mimeType":""}`)) {
		t.Errorf("the HAR of a client gone during its delay: %s", har)
	}
	if gone.Status != 499 || gone.Code != nil || gone.Prefer == nil || *gone.Prefer != "delay=5000" || len(gone.IDs) != 0 || gone.DurationMS <= 0 || gone.DurationMS > 4000 {
		t.Errorf("the entry of a client gone during its delay is %+v, want status 499 when it went, before the delay's end", gone)
	}
}

// bodyWatcher calls first when the first byte of a body is written.
type bodyWatcher struct {
	http.ResponseWriter
	first func()
}

func (w *bodyWatcher) Write(b []byte) (int, error) {
	if w.first != nil && len(b) > 0 {
		w.first()
		w.first = nil
	}
	return w.ResponseWriter.Write(b)
}

// TestJournalAsHAR: format=har answers the same entries as a HAR 1.2 log with every member
// HAR 1.2 requires, which a browser's developer tools open.
func TestJournalAsHAR(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1})
	e.get(t, "/v1/orders?limit=2&status=unfulfilled", "sk_test_sandbox_all", "Prefer", `run="har"`)
	e.get(t, "/v1/orders/ord_sbx_0001", "sk_test_sandbox_all", "Prefer", "code=503")
	e.do(t, newRequest(http.MethodHead, "/v1/orders/ord_sbx_0001", "sk_test_sandbox_all"))
	e.do(t, newBodyRequest(http.MethodPost, "/v1/test_helpers/clock", "sk_test_sandbox_all", `{"frozen_time":null}`))
	plain := e.journalOf(t, "sk_test_sandbox_all", "")
	r := newRequest("GET", "/v1/test_helpers/requests?format=har", "sk_test_sandbox_all")
	r.Host = "localhost:9999"
	rep := e.do(t, r)
	var har map[string]any
	if err := json.Unmarshal(rep.body, &har); err != nil || rep.header.Get("Content-Type") != "application/json" {
		t.Fatalf("HAR: %v, Content-Type %q", err, rep.header.Get("Content-Type"))
	}
	required := func(where string, obj any, members ...string) map[string]any {
		m, ok := obj.(map[string]any)
		if !ok {
			t.Fatalf("%s is not an object: %v", where, obj)
		}
		for _, name := range members {
			if _, ok := m[name]; !ok {
				t.Errorf("%s lacks %q, which HAR 1.2 requires", where, name)
			}
		}
		return m
	}
	log := required("log", har["log"], "version", "creator", "entries")
	required("creator", log["creator"], "name", "version")
	entries, _ := log["entries"].([]any)
	if log["version"] != "1.2" || len(entries) != len(plain.Data) {
		t.Fatalf("HAR version %v with %d entries, want 1.2 with %d", log["version"], len(entries), len(plain.Data))
	}
	for i, x := range entries {
		where := fmt.Sprintf("entries[%d]", i)
		entry := required(where, x, "startedDateTime", "time", "request", "response", "cache", "timings")
		req := required(where+".request", entry["request"], "method", "url", "httpVersion", "cookies", "headers", "queryString", "headersSize", "bodySize")
		res := required(where+".response", entry["response"], "status", "statusText", "httpVersion", "cookies", "headers", "content", "redirectURL", "headersSize", "bodySize")
		content := required(where+".response.content", res["content"], "size", "mimeType")
		timings := required(where+".timings", entry["timings"], "send", "wait", "receive")
		if _, err := time.Parse(time.RFC3339Nano, entry["startedDateTime"].(string)); err != nil || timings["wait"] != entry["time"] {
			t.Errorf("%s: startedDateTime %v, time %v, wait %v", where, entry["startedDateTime"], entry["time"], timings["wait"])
		}
		want := plain.Data[i]
		headers := map[string]string{}
		for _, h := range req["headers"].([]any) {
			headers[h.(map[string]any)["name"].(string)] = h.(map[string]any)["value"].(string)
		}
		if req["method"] != want.Method || req["url"] != "http://localhost:9999"+want.Target || req["httpVersion"] != "HTTP/1.1" || headers["Authorization"] != "Bearer "+want.Key {
			t.Errorf("%s.request = %v, want %s http://localhost:9999%s with Authorization Bearer %s", where, req, want.Method, want.Target, want.Key)
		}
		if want.Prefer != nil && headers["Prefer"] != *want.Prefer {
			t.Errorf("%s.request carries Prefer %q, want %q", where, headers["Prefer"], *want.Prefer)
		}
		resHeaders := map[string]string{}
		for _, h := range res["headers"].([]any) {
			resHeaders[h.(map[string]any)["name"].(string)] = h.(map[string]any)["value"].(string)
		}
		if res["status"] != float64(want.Status) || res["statusText"] != http.StatusText(want.Status) || resHeaders["Request-Id"] != want.RequestID {
			t.Errorf("%s.response = %v, want %d with Request-Id %s", where, res, want.Status, want.RequestID)
		}
		if want.RetryAfter != nil && resHeaders["Retry-After"] != strconv.Itoa(*want.RetryAfter) {
			t.Errorf("%s.response has Retry-After %q, want %d", where, resHeaders["Retry-After"], *want.RetryAfter)
		}
		if content["mimeType"] != resHeaders["Content-Type"] || content["size"].(float64) <= 0 {
			t.Errorf("%s.response.content = %v", where, content)
		}
	}
	query := entries[0].(map[string]any)["request"].(map[string]any)["queryString"]
	if got, _ := json.Marshal(query); string(got) != `[{"name":"limit","value":"2"},{"name":"status","value":"unfulfilled"}]` {
		t.Errorf("queryString = %s", got)
	}
	if got := entries[2].(map[string]any)["response"].(map[string]any)["bodySize"]; got != float64(0) {
		t.Errorf("a HEAD's bodySize is %v, want 0", got)
	}
	if got := entries[3].(map[string]any)["request"].(map[string]any)["bodySize"]; got != float64(20) {
		t.Errorf("a POST's request bodySize is %v, want 20, its body's bytes (the journal keeps the size, not the body)", got)
	}
	if rep := e.get(t, "/v1/test_helpers/requests?format=har&run=har&limit=1", "sk_test_sandbox_all"); bytes.Count(rep.body, []byte(`"startedDateTime"`)) != 1 {
		t.Errorf("format=har with run and limit: %s", rep.body)
	}
}

// TestJournalNeverShowsAKey: a key's mask in an entry, the HAR, a log line and the page's
// journal, never the key: its last 4 characters, after its first 8 when it has 24 or more.
func TestJournalNeverShowsAKey(t *testing.T) {
	t.Parallel()
	long := "sk_test_0123456789abcdefghijklmnop"
	data := dataset(dsAccounts, `{"key":"`+long+`","account":"acct_a","environment":"test","scopes":["orders:read"]},{"key":"k7","account":"acct_a","environment":"test","scopes":[]},{"key":"k12345678","account":"acct_a","environment":"test","scopes":[]}`, "", "")
	e := newEnv(t, envOptions{data: []byte(data), rate: -1})
	for _, key := range []string{long, "k7", "k12345678"} {
		e.get(t, "/v1/orders", key)
		e.get(t, "/v1/orders", key, "Prefer", "code=429")
	}
	got := e.journalOf(t, long, "")
	var masks []string
	for _, x := range got.Data {
		masks = append(masks, x.Key)
	}
	if want := []string{"sk_test_...mnop", "sk_test_...mnop", "...", "...", "...5678", "...5678"}; !slices.Equal(masks, want) {
		t.Errorf("keys journaled as %v, want %v", masks, want)
	}
	har := e.get(t, "/v1/test_helpers/requests?format=har", long).body
	page := tenantOnPage(t, string(e.get(t, "/", "").body), "acct_a/test")
	journalPart := page[strings.Index(page, "<h3>Requests</h3>"):]
	body, _ := json.Marshal(got)
	for what, text := range map[string]string{"the journal": string(body), "the HAR": string(har), "the log": e.logs.String(), "the page's journal": journalPart} {
		for _, key := range []string{long, "Bearer k7", "Bearer k12345678"} {
			if strings.Contains(text, key) {
				t.Errorf("%s shows the key %s", what, key)
			}
		}
	}
}

// syncAt lists acct_sync's orders at start+s with query, and reads those of ids by id, all
// tagged with run.
func (e *env) syncAt(t *testing.T, run string, s int, query string, ids ...string) []orderJSON {
	t.Helper()
	key, at := "sk_test_sync_all", fmt.Sprintf(`clock="start+%ds", run=%q`, s, run)
	var orders []orderJSON
	p := decodePage(t, e.get(t, "/v1/orders?"+query, key, "Prefer", at))
	orders = append(orders, p.Data...)
	for _, id := range ids {
		var o orderJSON
		if err := json.Unmarshal(e.get(t, "/v1/orders/"+id, key, "Prefer", at).body, &o); err == nil && o.ID != "" {
			orders = append(orders, o)
		}
	}
	return orders
}

// TestFindingsOfAnOrderSync: the watermark sync the README shows first misses
// ord_sync_0002 and holds ord_sync_0001 stale; a sync that looks back and re-reads by id,
// one that reads the whole list at every instant, and one that polls a status all have no
// finding.
func TestFindingsOfAnOrderSync(t *testing.T) {
	t.Parallel()
	instants := []int{0, 30, 60, 90, 120}
	for _, tt := range []struct {
		name string
		sync func(e *env, t *testing.T)
		want string
	}{
		{"watermark", func(e *env, t *testing.T) {
			wm := "2000-01-01T00:00:00Z"
			for _, s := range instants {
				for _, o := range e.syncAt(t, "sync", s, "limit=100&created_from="+wm) {
					wm = max(wm, o.CreatedAt)
				}
			}
		}, "missed_import ord_sync_0002 [1 5]\nstale_order ord_sync_0001 [1 5]"},
		{"look-back and by id", func(e *env, t *testing.T) {
			wm, known := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC), map[string]orderJSON{}
			for _, s := range instants {
				from := wm.Add(-6 * time.Minute)
				var behind []string // followed, behind the window, not settled
				for id, o := range known {
					created, _ := time.Parse(time.RFC3339Nano, o.CreatedAt)
					if created.Before(from) && o.Status != "cancelled" && !(o.Status == "fulfilled" && o.ShipmentID != nil) {
						behind = append(behind, id)
					}
				}
				slices.Sort(behind)
				for _, o := range e.syncAt(t, "sync", s, "limit=100&created_from="+formatTimestamp(from), behind...) {
					known[o.ID] = o
					if created, _ := time.Parse(time.RFC3339Nano, o.CreatedAt); created.After(wm) {
						wm = created
					}
				}
			}
		}, ""},
		{"the whole list each time", func(e *env, t *testing.T) {
			for _, s := range instants {
				e.syncAt(t, "sync", s, "limit=100")
			}
		}, ""},
		{"polling unfulfilled", func(e *env, t *testing.T) {
			for _, s := range instants {
				e.syncAt(t, "sync", s, "limit=100&status=unfulfilled")
			}
		}, ""},
		{"polling fulfilled, which 0002 never is", func(e *env, t *testing.T) {
			for _, s := range instants {
				e.syncAt(t, "sync", s, "limit=100&status=fulfilled")
			}
		}, ""},
		{"a page that stops short of 0002's place", func(e *env, t *testing.T) {
			e.syncAt(t, "sync", 0, "limit=2")
			e.syncAt(t, "sync", 120, "limit=2")
		}, ""},
		{"a last read before the import", func(e *env, t *testing.T) {
			e.syncAt(t, "sync", 0, "limit=100")
			e.syncAt(t, "sync", 60, "limit=100&created_from="+formatTimestamp(testNow))
		}, "stale_order ord_sync_0005 [1 2]\nstale_order ord_sync_0001 [1 2]"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, envOptions{step: -1, rate: -1})
			tt.sync(e, t)
			f := e.findingsOf(t, "sk_test_sync_all", "")
			if got := f.summary(); got != tt.want {
				t.Errorf("findings:\n%s\nwant\n%s", got, tt.want)
			}
			for _, x := range f.Data {
				if !strings.Contains(x.Detail, *x.ID) || !strings.HasSuffix(x.Detail, ".") {
					t.Errorf("%s's detail %q does not name %s", x.Code, x.Detail, *x.ID)
				}
			}
		})
	}
}

// TestOrderFindingsAgreeWithTheirDefinition: over journals of random pages (filters,
// cursors, limits) and reads by id at random instants of datasets whose orders move, the
// order findings judged beside the pages in one walk are exactly those the contract's
// definitions give when every page is asked of every order, as written here.
func TestOrderFindingsAgreeWithTheirDefinition(t *testing.T) {
	t.Parallel()
	base := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	for seed := range uint64(6) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, envOptions{data: []byte(movingDataset(300, seed)), rate: -1, quiet: true})
			rnd := rand.New(rand.NewPCG(seed, 9))
			instant := func() string { return formatTimestamp(base.Add(time.Duration(rnd.IntN(360)) * time.Minute)) }
			cursors := map[string]string{} // a query's next cursor
			for range 250 {
				at := instant()
				if rnd.IntN(5) == 0 {
					e.get(t, fmt.Sprintf("/v1/orders/ord_%04d", rnd.IntN(300)), "sk_test_a", "Prefer", `clock="`+at+`"`)
					continue
				}
				q := fmt.Sprintf("limit=%d", 1+rnd.IntN(40))
				if rnd.IntN(2) == 0 {
					q += "&status=" + orderStatuses[rnd.IntN(len(orderStatuses))]
				}
				if rnd.IntN(3) == 0 {
					q += "&created_from=" + formatTimestamp(base.Add(time.Duration(rnd.IntN(300))*time.Minute))
				}
				if rnd.IntN(3) == 0 {
					q += "&created_to=" + formatTimestamp(base.Add(time.Duration(150+rnd.IntN(300))*time.Minute))
				}
				target := "/v1/orders?" + q
				if c := cursors[q]; c != "" && rnd.IntN(2) == 0 {
					target += "&cursor=" + url.QueryEscape(c)
				}
				rep := e.get(t, target, "sk_test_a", "Prefer", `clock="`+at+`"`)
				if rep.status != 200 {
					continue // created_from after created_to
				}
				if p := decodePage(t, rep); p.Pagination.NextCursor != nil {
					cursors[q] = *p.Pagination.NextCursor
				}
			}
			e.get(t, "/v1/orders/ord_0000", "sk_test_a", "Prefer", `clock="`+formatTimestamp(base.Add(24*time.Hour))+`"`) // the latest read: every change has happened
			tn := e.sb.tenants.byID[tenantID{"acct_a", "test"}]
			es := tn.journalPart(journalRead{}).entries
			var got []string
			for _, f := range tn.current().orderFindings(es) {
				got = append(got, fmt.Sprintf("%s %s %d %d", findingKinds[f.kind].code, tn.current().orders.timedID(int(f.m)), es[f.cited[0]].seq, es[f.cited[1]].seq))
			}
			want, left := orderFindingsByDefinition(tn.current(), es)
			slices.Sort(got)
			slices.Sort(want)
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("judged in one walk:\n%s\nby the definitions:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			if len(want) < 5 || left == 0 {
				t.Errorf("%d order findings, %d stale sightings excused by a page the order left: the journal does not exercise the judge", len(want), left)
			}
		})
	}
}

// orderFindingsByDefinition is the order findings of es as the contract defines them, each
// page asked of each order: "code id seq seq"; and how many stale sightings a page that the
// order left excused.
func orderFindingsByDefinition(d *tenantData, es []journalEntry) (out []string, excused int) {
	ix := &d.orders
	covers := func(p *listedPage, i int) bool { // its created_from..created_to holds the order, and it reached its place
		c := ix.records[i].created()
		return !p.filter.from.after(c) && !c.after(p.filter.to) && (!p.more || int(p.last) > i)
	}
	seen := map[int]*journalEntry{}
	var pages []*journalEntry
	var latest *journalEntry
	for k := range es {
		e := &es[k]
		if !e.read() {
			continue
		}
		if latest == nil || laterRead(e, latest) {
			latest = e
		}
		var shown []int
		switch e.shown.kind {
		case showsOrder:
			shown = []int{int(e.shown.order)}
		case showsPage:
			pages = append(pages, e)
			ix.pageOrders(&e.shown.page, e.clock, func(i int) { shown = append(shown, i) })
		}
		for _, i := range shown {
			if m, ok := ix.timedOf(i); ok && (seen[m] == nil || laterRead(e, seen[m])) {
				seen[m] = e
			}
		}
	}
	for m := range ix.timedCount() {
		i, tl := int(ix.timed[m]), &ix.timelines[m]
		if s := seen[m]; s != nil {
			then, _ := ix.timedState(m, s.clock, s.writes)
			now, _ := ix.timedState(m, latest.clock, latest.writes)
			if then.status == now.status && then.linked == now.linked {
				continue
			}
			left := false
			for _, l := range pages {
				st, ok := ix.showsAs(tl, l.clock)
				left = left || l.clock.after(s.clock) && !l.clock.after(latest.clock) && ok && covers(&l.shown.page, i) &&
					l.shown.page.filter.equalities() > 0 && !l.shown.page.filter.keeps(&ix.records[i], st)
			}
			if left {
				excused++
			} else {
				out = append(out, fmt.Sprintf("stale_order %s %d %d", ix.timedID(m), s.seq, latest.seq))
			}
			continue
		}
		created, imported := ix.timedInstants(m)
		if !imported.after(created) || imported.after(latest.clock) {
			continue
		}
		st, _ := ix.showsAs(tl, imported)
		var held *journalEntry
		for _, l := range pages {
			if imported.after(l.clock) && covers(&l.shown.page, i) && l.shown.page.filter.keeps(&ix.records[i], st) && (held == nil || l.seq > held.seq) {
				held = l
			}
		}
		if held != nil {
			out = append(out, fmt.Sprintf("missed_import %s %d %d", ix.timedID(m), held.seq, latest.seq))
		}
	}
	return out, excused
}

// TestFindingsKeepRunsApart: two scenarios at once on one tenant, each tagged with its
// own Prefer run, are judged apart; together, each covers what the other missed.
func TestFindingsKeepRunsApart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{step: -1, rate: -1})
	wm := "2000-01-01T00:00:00Z"
	for _, s := range []int{0, 30, 60, 90, 120} {
		for _, o := range e.syncAt(t, "watermark", s, "limit=100&created_from="+wm) {
			wm = max(wm, o.CreatedAt)
		}
		e.syncAt(t, "whole-list", s, "limit=100")
	}
	for query, want := range map[string]string{
		"run=watermark":  "missed_import ord_sync_0002 [1 9]\nstale_order ord_sync_0001 [1 9]",
		"run=whole-list": "",
		"":               "",
	} {
		if got := e.findingsOf(t, "sk_test_sync_all", query).summary(); got != want {
			t.Errorf("findings?%s:\n%s\nwant\n%s", query, got, want)
		}
	}
	if got := e.journalOf(t, "sk_test_sync_all", "run=whole-list"); len(got.Data) != 5 || got.Data[0].Seq != 2 || got.LastSeq != 10 {
		t.Errorf("requests?run=whole-list: %d entries from seq %d, last_seq %d", len(got.Data), got.Data[0].Seq, got.LastSeq)
	}
}

// TestEntriesKeepTheirRunWhateverAnsweredThem: a request answered before the Prefer step (a
// 401 of an expired or revoked key, a 403, a 429 of the rate limit) or by its refusal keeps
// the valid run it sent, so a run's read finds retry_too_soon for a real rate limit; a bad
// run tags nothing.
func TestEntriesKeepTheirRunWhateverAnsweredThem(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: 1, step: -1})
	run := `run="rl"`
	for range 3 { // 200, then two 429s of the rate limit within its Retry-After
		e.get(t, "/v1/orders", "sk_test_sandbox_all", "Prefer", run)
	}
	e.get(t, "/v1/orders", "sk_test_sandbox_expired", "Prefer", run)                    // 401
	e.get(t, "/v1/orders", "sk_test_sandbox_revoked", "Prefer", run)                    // 401
	e.get(t, "/v1/orders", "sk_test_sandbox_tracking", "Prefer", run)                   // 403
	e.get(t, "/v1/orders", "sk_test_sandbox_orders", "Prefer", "code=418, "+run)        // 422 at the Prefer step
	e.get(t, "/v1/orders", "sk_test_sandbox_none", "Prefer", `run="bad tag", run="rl"`) // the first run counts: a bad one tags nothing
	e.clock.advance(2 * time.Second)                                                    // the rate limit lets each read through
	got := e.journalOf(t, "sk_test_sandbox_none", "run=rl")
	e.clock.advance(2 * time.Second)
	var seen []string
	for _, x := range got.Data {
		seen = append(seen, fmt.Sprintf("%d %d", x.Seq, x.Status))
	}
	if want := "1 200,2 429,3 429,4 401,5 401,6 403,7 422"; strings.Join(seen, ",") != want {
		t.Errorf("requests?run=rl: %s, want %s", strings.Join(seen, ","), want)
	}
	if f := e.findingsOf(t, "sk_test_sandbox_none", "run=rl"); f.summary() != "retry_too_soon - [2 3]" {
		t.Errorf("findings?run=rl:\n%s\nwant retry_too_soon [2 3]", f.summary())
	}
}

// TestFindingsOfRetriesAndSharedNumbers: a retry sent before an answer's Retry-After has
// passed is found, one after it is not; a lookup by a number two shipments hold is found,
// once a number, citing its first and last.
func TestFindingsOfRetriesAndSharedNumbers(t *testing.T) {
	t.Parallel()
	key := "sk_test_sandbox_all"
	e := newEnv(t, envOptions{rate: -1})
	e.get(t, "/v1/orders", key, "Prefer", "code=503")                      // 1: Retry-After: 1
	e.get(t, "/v1/orders", key, "Prefer", "code=503")                      // 2: at once
	e.get(t, "/v1/orders", key, "Prefer", "code=503")                      // 3: at once
	e.get(t, "/v1/orders?limit=1", key, "Prefer", "code=503")              // 4: another target
	e.get(t, "/v1/orders", "sk_test_sandbox_orders", "Prefer", "code=503") // 5: another key
	e.get(t, "/v1/tracking/SBX2000000000", key)                            // 6: twins
	e.get(t, "/v1/tracking/SBX9999999999", key)                            // 7: nobody's
	e.get(t, "/v1/tracking/SBX2000000000", key)                            // 8
	e.get(t, "/v1/shipments/shp_sbx_twin_a/tracking", key)                 // 9
	f := e.findingsOf(t, key, "")
	if got, want := f.summary(), "retry_too_soon - [1 2]\nambiguous_number - [6 8]"; got != want {
		t.Fatalf("findings:\n%s\nwant\n%s", got, want)
	}
	if d := f.Data[0].Detail; !strings.Contains(d, "GET /v1/orders was sent 2 times before the Retry-After") || !strings.Contains(d, "Retry-After: 1") {
		t.Errorf("retry_too_soon's detail %q does not count the two early retries", d)
	}
	if d := f.Data[1].Detail; !strings.Contains(d, `"SBX2000000000"`) || !strings.Contains(d, "409") || !strings.Contains(d, "/v1/shipments/{id}/tracking") {
		t.Errorf("ambiguous_number's detail %q", d)
	}
	if one := e.findingsOf(t, key, "after=7"); one.summary() != "ambiguous_number - [8]" {
		t.Errorf("one lookup of a shared number: %s", one.summary())
	}
	// The rate limit's 429 says when too: a client that waits it out has no finding.
	limited := newEnv(t, envOptions{rate: 1, step: -1})
	limited.get(t, "/v1/orders/ord_sbx_0001", key)
	limited.get(t, "/v1/orders/ord_sbx_0001", key) // 429, Retry-After: 1
	limited.clock.advance(2 * time.Second)
	time.Sleep(1100 * time.Millisecond)
	limited.get(t, "/v1/orders/ord_sbx_0001", key)
	e.get(t, "/v1/orders?patient", key, "Prefer", "code=429")
	time.Sleep(1100 * time.Millisecond)
	e.get(t, "/v1/orders?patient", key)
	for _, x := range []findingsOut{limited.findingsOf(t, "sk_test_sandbox_none", ""), e.findingsOf(t, key, "after=9")} {
		if len(x.Data) != 0 {
			t.Errorf("a client that waited out Retry-After has findings: %s", x.summary())
		}
	}
}

// countedSection is a tenant's section of the page once its findings are counted up to its
// newest entry: the page shows what is counted within its wait, and a reload shows the rest.
func countedSection(t *testing.T, e *env, name string) string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		section := tenantOnPage(t, string(e.get(t, "/", "").body), name)
		if !strings.Contains(section, "judging the rest: reload") {
			return section
		}
		if time.Now().After(deadline) {
			t.Fatalf("the page never counts %s's findings:\n%s", name, section)
		}
	}
}

// TestPageSaysRunsAreJudgedApart: the README's watermark sync, tagged run="watermark", has
// two findings in its run, while every request judged together (a full read after it makes
// good what it missed) has none: the page says that runs are judged apart, and links the
// runs of the requests it shows.
func TestPageSaysRunsAreJudgedApart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{step: -1, rate: -1})
	wm := "2000-01-01T00:00:00Z"
	for _, s := range []int{0, 30, 60, 90, 120} {
		rep := e.get(t, "/v1/orders?limit=100&created_from="+wm, "sk_test_sync_all", "Prefer", fmt.Sprintf(`clock="start+%ds", run="watermark"`, s))
		for _, o := range decodePage(t, rep).Data {
			wm = max(wm, o.CreatedAt)
		}
	}
	e.get(t, "/v1/orders?limit=100", "sk_test_sync_all", "Prefer", `clock="start+120s"`) // every order as it ends
	if got := e.findingsOf(t, "sk_test_sync_all", "run=watermark"); len(got.Data) != 2 {
		t.Fatalf("the run's findings: %s", got.summary())
	}
	section := countedSection(t, e, "acct_sync/test")
	for _, want := range []string{"6 requests journaled; findings: 0 (", "is judged apart, on its own requests alone", `the runs above: <a href="http://127.0.0.1:8080/v1/test_helpers/findings?run=watermark">watermark</a>.`} {
		if !strings.Contains(section, want) {
			t.Errorf("the page's acct_sync/test does not say %q:\n%s", want, section)
		}
	}
}

// TestJournalOnTheLandingPage: the page shows, for each tenant whose keys it shows, its last
// 5 entries, its number of findings and the first 5 of them; not where it hides the keys,
// nor with -journal 0.
func TestJournalOnTheLandingPage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1})
	for i := range 7 {
		e.get(t, fmt.Sprintf("/v1/orders?limit=%d", i+1), "sk_test_sandbox_all")
	}
	e.get(t, "/v1/tracking/SBX2000000000", "sk_test_sandbox_all")
	section := countedSection(t, e, "acct_sandbox/test")
	for _, want := range []string{"<h3>Requests</h3>", "<td>4<td>", "GET<td>/v1/orders?limit=4<td>200", "GET<td>/v1/tracking/SBX2000000000<td>404", "8 requests journaled; findings: 1",
		"<tr><td>ambiguous_number<td><td>8<td>Tracking number &#34;SBX2000000000&#34; was held by more than one shipment"} {
		if !strings.Contains(section, want) {
			t.Errorf("acct_sandbox's section lacks %q:\n%s", want, section)
		}
	}
	if strings.Contains(section, "limit=3<") {
		t.Error("the page shows more than the last 5 entries")
	}
	if sync := tenantOnPage(t, string(e.get(t, "/", "").body), "acct_sync/test"); !strings.Contains(sync, "None journaled yet.") {
		t.Error("a tenant never called is not said to have no entry")
	}
	e.get(t, "/v1/tracking/SBX2000000000", "sk_test_sandbox_all")
	if section := countedSection(t, e, "acct_sandbox/test"); !strings.Contains(section, "9 requests journaled; findings: 1") || !strings.Contains(section, "<td>8, 9<td>") {
		t.Errorf("the page's count did not follow a new entry:\n%s", section)
	}
	for range 6 { // seven findings: five shown, two counted
		e.get(t, "/v1/orders?limit=1", "sk_test_sandbox_all", "Prefer", "code=503")
		e.get(t, "/v1/orders?limit=1", "sk_test_sandbox_all") // within its Retry-After
		e.get(t, "/v1/orders?limit=1&x", "sk_test_sandbox_all")
	}
	e.get(t, "/v1/orders?limit=1", "sk_test_other_all", "Prefer", "code=429")
	for i := range 6 {
		e.get(t, "/v1/orders?n="+strconv.Itoa(i), "sk_test_sandbox_all", "Prefer", "code=429")
		e.get(t, "/v1/orders?n="+strconv.Itoa(i), "sk_test_sandbox_all")
	}
	section = countedSection(t, e, "acct_sandbox/test")
	if got := strings.Count(section, "<tr><td>retry_too_soon<td>"); got != 4 || !strings.Contains(section, "findings: 8 ") || !strings.Contains(section, "and 3 more findings") {
		t.Errorf("8 findings: the page shows %d retry_too_soon rows of 4 (and the count and the rest):\n%s", got, section)
	}
	for name, page := range map[string]string{
		"remote":     string(newEnv(t, envOptions{remote: true}).get(t, "/", "").body),
		"-journal 0": string(newEnv(t, envOptions{journal: -1}).get(t, "/", "").body),
	} {
		if strings.Contains(page, "<h3>Requests</h3>") {
			t.Errorf("the %s page shows the journal", name)
		}
	}
}

// TestFindingsAreCountedAside: the page never judges a journal on its request's path: it
// starts a count aside and waits for it at most pageCountWait, then shows the count as it
// was last made, and up to which request; a reload shows the new count once made.
func TestFindingsAreCountedAside(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, quiet: true})
	for range 3 {
		e.get(t, "/v1/tracking/SBX2000000000", "sk_test_sandbox_all") // ambiguous: one finding however often
	}
	if s := countedSection(t, e, "acct_sandbox/test"); !strings.Contains(s, "3 requests journaled; findings: 1 (") {
		t.Fatalf("three lookups of a shared number:\n%s", s)
	}
	tn := e.sb.tenants.byID[seedTenant]
	j := tn.heldJournal()
	stuck := make(chan struct{}) // a count that does not end: as one of a journal of 100,000 entries
	tn.mu.Lock()
	j.counting = stuck
	tn.mu.Unlock()
	e.get(t, "/v1/orders/ord_sbx_0001", "sk_test_sandbox_all", "Prefer", "code=503")
	e.get(t, "/v1/orders/ord_sbx_0001", "sk_test_sandbox_all") // within its Retry-After: a second finding
	if s := tenantOnPage(t, string(e.get(t, "/", "").body), "acct_sandbox/test"); !strings.Contains(s, "5 requests journaled; findings: 1 up to request 3; judging the rest: reload (") {
		t.Fatalf("while a count runs, the page does not show the count before it:\n%s", s)
	}
	tn.mu.Lock()
	j.counting = nil
	tn.mu.Unlock()
	close(stuck)
	if s := countedSection(t, e, "acct_sandbox/test"); !strings.Contains(s, "5 requests journaled; findings: 2 (") {
		t.Fatalf("once the count ends, the page does not show the new one:\n%s", s)
	}
}

// TestJournalingCostsAtMostOneAllocation: a journaled request allocates at most once more
// than the same request with -journal 0. Not parallel: it counts allocations.
func TestJournalingCostsAtMostOneAllocation(t *testing.T) {
	for _, target := range []string{"/v1/orders/ord_sbx_0001", "/v1/orders?limit=100", "/v1/shipments/shp_sbx_spring/tracking", "/v1/orders/ord_nope"} {
		allocs := map[bool]float64{}
		for _, on := range []bool{false, true} {
			o := envOptions{seed: 1000, rate: -1, quiet: true, journal: -1}
			if on {
				o.journal = 0
			}
			e := newEnv(t, o)
			r := newRequest("GET", target, "sk_test_sandbox_all")
			r.RequestURI = target // as a server reads it off the request line
			w := &benchWriter{h: http.Header{}}
			allocs[on] = testing.AllocsPerRun(2000, func() {
				clear(w.h)
				w.status, w.buf = 0, w.buf[:0]
				e.h.ServeHTTP(w, r)
			})
		}
		t.Logf("%s: %.0f allocations, %.0f without the journal", target, allocs[true], allocs[false])
		if allocs[true] > allocs[false]+1 {
			t.Errorf("%s: %.0f allocations journaled, %.0f not: the journal may cost one", target, allocs[true], allocs[false])
		}
	}
}

// TestFindingsAreOneTable: the findings are one table (findingKinds): the document's enum of
// a finding's code, each code's description there, and the rows of the findings table in
// docs/journal-and-findings.md follow from it, in its order and its words; and a judge
// answers only its codes. A new finding is one entry, its judge and its tests.
func TestFindingsAreOneTable(t *testing.T) {
	t.Parallel()
	var doc struct {
		Components struct {
			Schemas struct {
				Finding struct {
					Properties struct {
						Code struct {
							Enum         []string          `json:"enum"`
							Descriptions map[string]string `json:"x-enumDescriptions"`
							Description  string            `json:"description"`
						} `json:"code"`
					} `json:"properties"`
				} `json:"Finding"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(openAPIDocument, &doc); err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile("docs/journal-and-findings.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\| (.*) \\| (.*) \\|$").FindAllStringSubmatch(string(page), -1)
	code := doc.Components.Schemas.Finding.Properties.Code
	var codes []string
	for i, k := range findingKinds {
		codes = append(codes, k.code)
		if i > 0 && findingKinds[i-1].code >= k.code {
			t.Errorf("findingKinds is not in the order of its codes at %s: findings of one seq sort by it", k.code)
		}
		if got := code.Descriptions[k.code]; got != k.definition {
			t.Errorf("the document describes %s as %q, the table as %q", k.code, got, k.definition)
		}
		if !strings.Contains(code.Description, k.code+": "+k.definition+".") {
			t.Errorf("the document's description of a finding's code does not say %s: %s", k.code, k.definition)
		}
		if i >= len(rows) || rows[i][1] != k.code || rows[i][2] != k.definition || rows[i][3] != k.advice {
			t.Errorf("docs/journal-and-findings.md's row %d is not | `%s` | %s | %s |", i+1, k.code, k.definition, k.advice)
		}
	}
	if !slices.Equal(code.Enum, codes) || len(rows) != len(findingKinds) {
		t.Errorf("the document's codes %v and %d rows in the docs, the table's %v", code.Enum, len(rows), codes)
	}
}

// BenchmarkFindings: judging a full journal of 1,000 limit=100 pages, each at its own
// instant; the contract asks under 50 ms. walk: pages walked by cursor over 100,000 orders
// of which 10% change status and 1% are imported late. rare_status: the first page of
// status=cancelled over 1,000,000 orders, 10% changing status, where one in 10,000 is
// cancelled: each page spans every order (a page of it takes some 0.4 ms to list).
func BenchmarkFindings(b *testing.B) {
	b.Run("walk", func(b *testing.B) {
		e, mid := timedOrders(b, 100000, true)
		benchFindings(b, e, "/v1/orders?limit=100", func(i int) time.Time { return mid.Add(time.Duration(i) * time.Minute) })
	})
	b.Run("rare_status", func(b *testing.B) {
		statuses := []string{"unfulfilled", "partially_fulfilled", "fulfilled"}
		e, mid := ordersOf(b, 1000000, 10, func(k int) string {
			if k%10000 == 0 {
				return "cancelled"
			}
			return statuses[k%len(statuses)]
		})
		benchFindings(b, e, "/v1/orders?limit=100&status=cancelled", func(i int) time.Time { return mid.Add(time.Duration(i) * time.Second) })
	})
	// The worst arrangement: every one of 100,000 orders changes status a month after the
	// newest is created; 999 pages read them before, walked by cursor, and the last page
	// after, so that nearly every order read is stale (99,800 findings). filtered: every
	// other page is of one status, over a day of created_at, at an instant between.
	for _, filtered := range []bool{false, true} {
		b.Run(fmt.Sprintf("all_stale/filtered=%v", filtered), func(b *testing.B) {
			e, newest := everyOrderChanges(b, 100000)
			before, after := newest.Add(time.Second), newest.Add(60*24*time.Hour)
			key, cursor := "sk_test_sandbox_all", ""
			for i := range defaultJournal {
				target, at := "/v1/orders?limit=100", before
				switch {
				case i == defaultJournal-1:
					at = after
				case filtered && i%2 == 1:
					day := newest.Add(-time.Duration(i) * 24 * time.Hour)
					target = "/v1/orders?limit=100&status=" + orderStatuses[i%4] + "&created_from=" + formatTimestamp(day) + "&created_to=" + formatTimestamp(day.Add(24*time.Hour))
					at = newest.Add(time.Duration(i) * time.Hour)
				case cursor != "":
					target += "&cursor=" + cursor
				}
				w := &benchWriter{h: http.Header{}}
				e.h.ServeHTTP(w, newRequest("GET", target, key, "Prefer", `clock="`+formatTimestamp(at)+`"`))
				var p pageJSON
				if err := json.Unmarshal(w.buf, &p); err != nil || w.status != 200 {
					b.Fatalf("page %d: %d %s", i, w.status, w.buf)
				}
				if !strings.Contains(target, "status=") && p.Pagination.NextCursor != nil {
					cursor = url.QueryEscape(*p.Pagination.NextCursor)
				}
			}
			var f findingsOut
			strict(b, e.get(b, "/v1/test_helpers/findings", key), &f)
			benchServe(b, e.h, newRequest("GET", "/v1/test_helpers/findings", key), 200)
			b.ReportMetric(float64(len(f.Data)+f.More), "findings")
		})
	}
}

// BenchmarkBlindRetries: the worst arrangement of blind_retry's judge, a full journal of
// -journal's most (100,000) writes of one body, each answered 502 under its own key, all
// arriving before any answer came: no entry is a blind retry of another, and each 502 is
// asked whether one is (walking the later entries took about 4 s).
func BenchmarkBlindRetries(b *testing.B) {
	k := &apiKey{}
	es := make([]journalEntry, maxJournal)
	for i := range es {
		es[i] = journalEntry{seq: uint64(i + 1), key: k, method: "POST", target: "/v1/test_helpers/shipments", status: http.StatusBadGateway,
			duration: int64(10 * time.Second), write: &writeMark{key: strconv.Itoa(i)}}
	}
	for b.Loop() {
		if fs := blindRetries(es); len(fs) != 0 {
			b.Fatalf("%d findings", len(fs))
		}
	}
}

// everyOrderChanges is a dataset of n orders, every one of which changes status once, a
// month after the newest (returned) is created.
func everyOrderChanges(b *testing.B, n int) (*env, time.Time) {
	return ordersOf(b, n, 1, func(k int) string { return orderStatuses[k%len(orderStatuses)] })
}

// benchFindings fills the journal with 1,000 pages of query, walked by cursor, page i at
// instant at(i), and times reading its findings.
func benchFindings(b *testing.B, e *env, query string, at func(i int) time.Time) {
	key, cursor := "sk_test_sandbox_all", ""
	for i := range defaultJournal {
		w := &benchWriter{h: http.Header{}}
		target := query
		if cursor != "" {
			target += "&cursor=" + cursor
		}
		e.h.ServeHTTP(w, newRequest("GET", target, key, "Prefer", `clock="`+formatTimestamp(at(i))+`"`))
		var p pageJSON
		if err := json.Unmarshal(w.buf, &p); err != nil || w.status != 200 {
			b.Fatalf("page %d: %d %s", i, w.status, w.buf)
		}
		cursor = ""
		if p.Pagination.NextCursor != nil {
			cursor = url.QueryEscape(*p.Pagination.NextCursor)
		}
	}
	benchServe(b, e.h, newRequest("GET", "/v1/test_helpers/findings", key), 200)
}

// ===== auth.go: Sandboxes and stored answers; main.go, serve: writes =====

// sandboxOut is POST /v1/test_helpers/sandboxes's answer as the contract writes it, the
// tests' own copy, decoded strictly.
type sandboxOut struct {
	Account     string  `json:"account"`
	Environment string  `json:"environment"`
	Template    *string `json:"template"`
	Profile     string  `json:"profile"`
	StartedAt   string  `json:"started_at"`
	Keys        []struct {
		Key       string   `json:"key"`
		Scopes    []string `json:"scopes"`
		ExpiresAt *string  `json:"expires_at"`
		Revoked   bool     `json:"revoked"`
	} `json:"keys"`
	IdleSeconds int `json:"idle_seconds"`
}

// sandboxAccountPattern and sandboxKeyPattern are a sandbox's account and a key made for it.
var (
	sandboxAccountPattern = regexp.MustCompile(`^acct_[a-z2-7]{20}$`)
	sandboxKeyPattern     = regexp.MustCompile(`^sk_test_[a-z2-7]{32}$`)
)

// postSandbox posts body with key under the Idempotency-Key idem ("" for none), and
// returns the reply, and the sandbox when it answered 201.
func (e *env) postSandbox(t testing.TB, key, body, idem string, headerPairs ...string) (reply, sandboxOut) {
	t.Helper()
	headers := append([]string{"Content-Type", "application/json"}, headerPairs...)
	if idem != "" {
		headers = append(headers, "Idempotency-Key", idem)
	}
	rep := e.do(t, newBodyRequest(http.MethodPost, "/v1/test_helpers/sandboxes", key, body, headers...))
	var out sandboxOut
	if rep.status == http.StatusCreated {
		mustDecodeExact(t, rep.body, &out)
	}
	return rep, out
}

// ids is the ids a 200 list answered, in order.
func listIDs(t testing.TB, rep reply) string {
	t.Helper()
	if rep.status != 200 {
		t.Fatalf("a list answered %s", rep)
	}
	return strings.Join(ids(decodePage(t, rep).Data), " ")
}

// TestSandboxes: POST /v1/test_helpers/sandboxes makes an account of its own, a copy of a
// dataset account (its relative instants from the sandbox's start) or of the records sent,
// with keys made for it; it sees nothing of any other account, and nobody sees it.
func TestSandboxes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, step: -1})
	rep, sb := e.postSandbox(t, "sk_test_sync_all", `{}`, "copy-1")
	if rep.status != 201 || !sandboxAccountPattern.MatchString(sb.Account) || sb.Environment != "test" || sb.Template == nil || *sb.Template != "acct_sync" ||
		sb.StartedAt != "2026-11-22T12:00:00Z" || sb.IdleSeconds != 3600 || len(sb.Keys) != 1 || !sandboxKeyPattern.MatchString(sb.Keys[0].Key) ||
		strings.Join(sb.Keys[0].Scopes, " ") != "tracking:read orders:read" || sb.Keys[0].ExpiresAt != nil || sb.Keys[0].Revoked {
		t.Fatalf("a copy of the caller's account: %s", rep)
	}
	if want := `{"account":"` + sb.Account + `","environment":"test","template":"acct_sync","profile":"sandbox","started_at":"2026-11-22T12:00:00Z","keys":[{"key":"` + sb.Keys[0].Key + `","scopes":["tracking:read","orders:read"],"expires_at":null,"revoked":false}],"idle_seconds":3600}`; string(rep.body) != want {
		t.Errorf("the answer's members:\n%s\nwant\n%s", rep.body, want)
	}
	key := sb.Keys[0].Key
	// acct_sync replayed from the sandbox's creation: at its start 0005, 0004, 0003, 0001.
	if got := listIDs(t, e.get(t, "/v1/orders", key)); got != "ord_sync_0005 ord_sync_0004 ord_sync_0003 ord_sync_0001" {
		t.Errorf("the copy at its start lists %s", got)
	}
	if got := listIDs(t, e.get(t, "/v1/orders", key, "Prefer", `clock="start+90s"`)); got != "ord_sync_0006 ord_sync_0005 ord_sync_0004 ord_sync_0003 ord_sync_0002 ord_sync_0001" {
		t.Errorf("the copy at start+90s lists %s", got)
	}
	if c := e.readClock(t, key); c.StartedAt != sb.StartedAt {
		t.Errorf("the copy's clock started at %s, want %s", c.StartedAt, sb.StartedAt)
	}
	for _, tt := range []struct{ target, key string }{
		{"/v1/orders/ord_sbx_0001", key},                    // another account's order
		{"/v1/shipments/shp_sbx_spring/tracking", key},      // another account's shipment
		{"/v1/orders/ord_sync_0001", "sk_test_sandbox_all"}, // the dataset's acct_sandbox sees no sandbox
	} {
		wantProblem(t, e.get(t, tt.target, tt.key), 404, "not_found", "")
	}
	// A template by name: the keys are the template's test keys, in the dataset's order.
	rep, copyOf := e.postSandbox(t, "sk_test_sync_all", `{"template":"acct_sandbox"}`, "copy-2")
	var states []string
	for _, k := range copyOf.Keys {
		exp := "-"
		if k.ExpiresAt != nil {
			exp = *k.ExpiresAt
		}
		states = append(states, fmt.Sprintf("%s/%s/%v", strings.Join(k.Scopes, "+"), exp, k.Revoked))
	}
	if want := "tracking:read+orders:read/-/false tracking:read/-/false orders:read/-/false /-/false tracking:read+orders:read/2026-01-01T00:00:00Z/false tracking:read+orders:read/-/true"; rep.status != 201 || strings.Join(states, " ") != want {
		t.Errorf("a copy of acct_sandbox: %d, keys %s, want %s", rep.status, strings.Join(states, " "), want)
	}
	wantProblem(t, e.get(t, "/v1/orders", copyOf.Keys[4].Key), 401, "expired_api_key", "")
	wantProblem(t, e.get(t, "/v1/orders", copyOf.Keys[5].Key), 401, "revoked_api_key", "")
	wantProblem(t, e.get(t, "/v1/orders", copyOf.Keys[1].Key), 403, "insufficient_scope", "")
	if rep := e.get(t, "/v1/shipments/shp_sbx_spring/tracking", copyOf.Keys[0].Key); rep.status != 200 {
		t.Errorf("the copy of acct_sandbox does not show shp_sbx_spring: %s", rep)
	}
	// Records of the test's own, read against the sandbox's start, and keys of its own.
	body := `{"orders":[{"id":"ord_1","merchant_reference":"R-1","platform":"ebay","status":"unfulfilled","created_at":"start-1h","imported_at":"start+30s"}],` +
		`"shipments":[{"id":"shp_1","reference":"S-1","tracking_number":"T1","order_id":"ord_1","created_at":"start+60s","events":[{"after":"60s","status":"in_transit","description":"Departed"}]}],` +
		`"keys":[{"scopes":["orders:read"]},{"scopes":["tracking:read"],"expires_at":"2099-01-01T00:00:00+01:00"}]}`
	rep, own := e.postSandbox(t, "sk_test_sandbox_none", body, "records-1")
	if rep.status != 201 || own.Template != nil || len(own.Keys) != 2 || own.Keys[1].ExpiresAt == nil || *own.Keys[1].ExpiresAt != "2098-12-31T23:00:00Z" {
		t.Fatalf("a sandbox of records: %s", rep)
	}
	orders, tracking := own.Keys[0].Key, own.Keys[1].Key
	wantProblem(t, e.get(t, "/v1/orders/ord_1", orders), 404, "not_found", "") // imported at +30 s
	if got := string(e.get(t, "/v1/orders/ord_1", orders, "Prefer", `clock="start+60s"`).body); !strings.Contains(got, `"shipment_id":"shp_1"`) {
		t.Errorf("at +60 s the order shows its link: %s", got)
	}
	if n, status := eventsOf(t, e.get(t, "/v1/tracking/T1", tracking, "Prefer", `clock="start+60s"`)); n != 1 || status != "in_transit" {
		t.Errorf("at +60 s shp_1 shows %d events, %s", n, status)
	}
	if got := e.findingsOf(t, orders, ""); got.Judged == nil {
		t.Error("the sandbox's journal holds nothing")
	}
	if got := e.journalOf(t, "sk_test_sync_all", ""); len(got.Data) != 2 || got.Data[0].Route != "/v1/test_helpers/sandboxes" || got.Data[0].IdempotencyKey == nil || *got.Data[0].IdempotencyKey != "copy-1" {
		t.Errorf("the making is journaled in the tenant of the key that made it: %+v", got.Data)
	}
	// A sandbox's key makes a sandbox of a template it names, or of records.
	rep, _ = e.postSandbox(t, key, `{}`, "from-a-sandbox")
	wantProblem(t, rep, 422, "invalid_parameter", "template")
	if rep, again := e.postSandbox(t, key, `{"template":"acct_sync"}`, "from-a-sandbox-2"); rep.status != 201 || again.Account == sb.Account {
		t.Errorf("a sandbox's key naming a template: %s", rep)
	}
}

// TestSandboxRefusals: every rule by which a body is refused, each answered with its status,
// code and the JSON path of the fault as param; a refused body makes nothing.
func TestSandboxRefusals(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, seed: maxSandboxRecords + 1})
	order := func(extra string) string {
		return `{"id":"ord_1","merchant_reference":"R","platform":"ebay","status":"unfulfilled","created_at":"start"` + extra + `}`
	}
	deep := strings.Repeat(`{"a":`, 10001) + "1" + strings.Repeat("}", 10001)
	for _, tt := range []struct {
		name, key, body string
		status          int
		code, param     string
	}{
		{"an array", "", `[]`, 400, "malformed_json", ""},
		{"not JSON", "", `{"template"`, 400, "malformed_json", ""},
		{"empty", "", ``, 400, "malformed_json", ""},
		{"invalid UTF-8", "", "{\"template\":\"\xff\"}", 400, "malformed_json", ""},
		{"trailing data", "", `{} {}`, 400, "malformed_json", ""},
		{"nested too deep", "", `{"orders":[` + deep + `]}`, 400, "malformed_json", ""},
		{"an unknown member", "", `{"template":"acct_sync","foo":1}`, 422, "unknown_parameter", "foo"},
		{"a member twice", "", `{"template":"acct_sync","template":"acct_other"}`, 422, "invalid_parameter", "template"},
		{"a member twice in another case", "", `{"template":"acct_sync","Template":"acct_other"}`, 422, "invalid_parameter", "Template"},
		{"an unknown template", "", `{"template":"acct_nope"}`, 422, "invalid_parameter", "template"},
		{"an unknown template, then an unknown member", "", `{"template":"acct_nope","foo":1}`, 422, "invalid_parameter", "template"},
		{"an unknown member, then an unknown template", "", `{"foo":1,"template":"acct_nope"}`, 422, "unknown_parameter", "foo"},
		{"a template too large, then an unknown member", "", `{"template":"acct_sandbox","foo":1}`, 422, "invalid_parameter", "template"},
		{"no key, then an unknown member", "", `{"keys":[],"foo":1}`, 422, "invalid_parameter", "keys"},
		{"an unknown member, then no key", "", `{"foo":1,"keys":[]}`, 422, "unknown_parameter", "foo"},
		{"a key's unknown scope", "", `{"template":null,"orders":[],"keys":[{"scopes":["x"]}]}`, 422, "invalid_parameter", "keys[0].scopes[0]"},
		{"a template over 10,000 orders", "", `{"template":"acct_sandbox"}`, 422, "invalid_parameter", "template"},
		{"a template, then records", "", `{"template":"acct_sync","orders":[]}`, 422, "invalid_parameter", "orders"},
		{"records, then a template", "", `{"shipments":[],"template":"acct_sync"}`, 422, "invalid_parameter", "template"},
		{"no key", "", `{"orders":[],"keys":[]}`, 422, "invalid_parameter", "keys"},
		{"21 keys", "", `{"orders":[],"keys":[` + strings.TrimSuffix(strings.Repeat(`{},`, 21), ",") + `]}`, 422, "invalid_parameter", "keys"},
		{"a key's text", "", `{"orders":[],"keys":[{"key":"sk_test_mine"}]}`, 422, "unknown_parameter", "keys[0].key"},
		{"a key's expiry without offset", "", `{"orders":[],"keys":[{"expires_at":"2099-01-01T00:00:00"}]}`, 422, "invalid_parameter", "keys[0].expires_at"},
		{"an order that names its owner", "", `{"orders":[` + order(`,"account":"acct_sandbox"`) + `]}`, 422, "unknown_parameter", "orders[0].account"},
		{"an order's status", "", `{"orders":[` + strings.Replace(order(""), "unfulfilled", "shipped", 1) + `]}`, 422, "invalid_parameter", "orders[0].status"},
		{"a change before its order", "", `{"orders":[` + order(`,"changes":[{"status":"fulfilled","at":"start-1m"}]`) + `]}`, 422, "invalid_parameter", "orders[0].changes[0].at"},
		{"an order id twice", "", `{"orders":[` + order("") + "," + order("") + `]}`, 422, "invalid_parameter", "orders[1].id"},
		{"a shipment without reference", "", `{"shipments":[{"id":"shp_1"}]}`, 422, "invalid_parameter", "shipments[0].reference"},
		{"a link to no order", "", `{"shipments":[{"id":"shp_1","reference":"S","order_id":"ord_9"}]}`, 422, "invalid_parameter", "shipments[0].order_id"},
		{"a second link", "", `{"orders":[` + order("") + `],"shipments":[{"id":"shp_1","reference":"S","order_id":"ord_1"},{"id":"shp_2","reference":"S","order_id":"ord_1"}]}`, 409, "order_already_linked", "shipments[1].order_id"},
		{"reading faults before filing faults", "", `{"shipments":[{"id":"shp_1","reference":"S","order_id":"ord_9"}],"orders":[` + strings.Replace(order(""), "ebay", "woo", 1) + `]}`, 422, "invalid_parameter", "orders[0].platform"},
		{"an expired key", "sk_test_sandbox_expired", `{}`, 401, "expired_api_key", ""},
		{"a live key", "sk_live_sandbox_all", `{}`, 503, "live_not_released", ""},
	} {
		t.Run(caseName(tt.name), func(t *testing.T) {
			key := cmp.Or(tt.key, "sk_test_sync_all")
			rep, _ := e.postSandbox(t, key, tt.body, "refused-"+strings.ReplaceAll(tt.name, " ", "-"))
			wantProblem(t, rep, tt.status, tt.code, tt.param)
		})
	}
	rep := e.do(t, newBodyRequest(http.MethodPost, "/v1/test_helpers/sandboxes?x=1", "sk_test_sync_all", `{}`, "Idempotency-Key", "q"))
	wantProblem(t, rep, 422, "unknown_parameter", "x")
	rep, _ = e.postSandbox(t, "sk_test_sync_all", `{"orders":[],"x":"`+strings.Repeat("a", maxBodyBytes)+`"}`, "too-large")
	wantProblem(t, rep, 413, "body_too_large", "")
	if n := e.srv.registry.count(e.clock.now()); n != 0 {
		t.Errorf("refused bodies made %d sandboxes", n)
	}
	// Any active test key, whatever its scopes, makes one; a dataset key names the template
	// by default, and acct_sandbox, seeded past 10,000, is too large to copy.
	rep, _ = e.postSandbox(t, "sk_test_sandbox_none", `{"orders":[]}`, "none-1")
	if rep.status != 201 {
		t.Errorf("a key without scopes: %s", rep)
	}
}

// TestIdempotencyKeys: a write carries one good Idempotency-Key; a repeat after the first
// finished is its answer again, byte for byte; a repeat while it runs, or the key with
// another body, is 409; a write that was not done leaves the key free.
func TestIdempotencyKeys(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1})
	post := func(t *testing.T, key, body string, fields ...string) reply {
		t.Helper()
		r := newBodyRequest(http.MethodPost, "/v1/test_helpers/sandboxes", key, body, "Content-Type", "application/json")
		for _, f := range fields {
			r.Header.Add("Idempotency-Key", f)
		}
		return e.do(t, r)
	}
	t.Run("syntax", func(t *testing.T) {
		for _, fields := range [][]string{nil, {""}, {`""`}, {"a", "b"}, {"a b"}, {`a"b`}, {`a\b`}, {"é"}, {strings.Repeat("k", 256)}, {`"abc`}} {
			wantProblem(t, post(t, "sk_test_sync_all", `{}`, fields...), 400, "invalid_idempotency_key", "Idempotency-Key")
		}
		if rep := post(t, "sk_test_sync_all", `{"orders":[]}`, strings.Repeat("k", 255)); rep.status != 201 {
			t.Errorf("a key of 255 characters: %s", rep)
		}
	})
	t.Run("replayed", func(t *testing.T) {
		first := post(t, "sk_test_sync_all", `{}`, "replay-me")
		again := post(t, "sk_test_sync_all", `{}`, `"replay-me"`) // the quoted spelling names the same key
		if first.status != 201 || again.status != 201 || !bytes.Equal(first.body, again.body) || again.header.Get("Idempotent-Replayed") != "true" ||
			first.header.Get("Idempotent-Replayed") != "" || again.header.Get("Request-Id") == first.header.Get("Request-Id") {
			t.Errorf("a repeat: %s, then %s (Idempotent-Replayed %q)", first, again, again.header.Get("Idempotent-Replayed"))
		}
		if e.srv.registry.count(e.clock.now()) == 0 {
			t.Fatal("no sandbox made")
		}
		// Stored per tenant, not per API key: another key of acct_sync replays it too.
		wantProblem(t, post(t, "sk_test_sync_all", `{"template":"acct_sync"}`, "replay-me"), 409, "idempotency_key_reused", "")
	})
	t.Run("a failed write frees its key", func(t *testing.T) {
		wantProblem(t, post(t, "sk_test_sandbox_all", `{"foo":1}`, "retry-me"), 422, "unknown_parameter", "foo")
		rep := post(t, "sk_test_sandbox_all", `{"orders":[]}`, "retry-me", "Prefer")
		wantProblem(t, e.do(t, func() *http.Request {
			r := newBodyRequest(http.MethodPost, "/v1/test_helpers/sandboxes", "sk_test_sandbox_all", `{"orders":[]}`, "Idempotency-Key", "retry-me", "Prefer", "code=503")
			return r
		}()), 503, "provider_unavailable", "")
		_ = rep
		if rep := post(t, "sk_test_sandbox_all", `{"orders":[]}`, "retry-me"); rep.status != 201 || rep.header.Get("Idempotent-Replayed") != "" {
			t.Errorf("after a 422 and a 503, the key's first write: %s", rep)
		}
	})
	t.Run("in progress", func(t *testing.T) {
		done := make(chan reply)
		go func() {
			r := newBodyRequest(http.MethodPost, "/v1/test_helpers/sandboxes", "sk_test_other_all", `{}`, "Idempotency-Key", "slow", "Prefer", "delay=5000")
			rec := httptest.NewRecorder()
			e.h.ServeHTTP(rec, r)
			done <- reply{status: rec.Code, header: rec.Header(), body: rec.Body.Bytes()}
		}()
		tenant := e.sb.tenants.byID[tenantID{"acct_other", "test"}]
		waitFor(t, "the slow write to hold its key", func() bool { return answerHeld(tenant, "slow") })
		rep := post(t, "sk_test_other_all", `{}`, "slow")
		wantProblem(t, rep, 409, "idempotency_key_in_use", "")
		if rep.header.Get("Retry-After") != "1" {
			t.Errorf("in use: Retry-After %q", rep.header.Get("Retry-After"))
		}
		wantProblem(t, post(t, "sk_test_other_all", `{"template":"acct_other"}`, "slow"), 409, "idempotency_key_reused", "")
		if first := <-done; first.status != 201 {
			t.Errorf("the slow write: %d %s", first.status, first.body)
		}
		if rep := post(t, "sk_test_other_all", `{}`, "slow"); rep.status != 201 || rep.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("once done: %s", rep)
		}
	})
	t.Run("502 after the write", func(t *testing.T) {
		r := newBodyRequest(http.MethodPost, "/v1/test_helpers/sandboxes", "sk_test_sync_all", `{"orders":[]}`, "Idempotency-Key", "unconfirmed", "Prefer", "code=502")
		rep := e.do(t, r)
		wantProblem(t, rep, 502, "provider_not_confirmed", "")
		if rep.header.Get("Preference-Applied") != "code=502" {
			t.Errorf("Preference-Applied %q", rep.header.Get("Preference-Applied"))
		}
		again := post(t, "sk_test_sync_all", `{"orders":[]}`, "unconfirmed")
		var made sandboxOut
		if again.status != 201 || again.header.Get("Idempotent-Replayed") != "true" || json.Unmarshal(again.body, &made) != nil {
			t.Fatalf("the same key after the 502: %s", again)
		}
		if rep := e.get(t, "/v1/orders", made.Keys[0].Key); rep.status != 200 {
			t.Errorf("the sandbox the 502 answered was made: its key answers %s", rep)
		}
		// A 502 that a check answers first is that check's answer.
		rep = e.do(t, newBodyRequest(http.MethodPost, "/v1/test_helpers/sandboxes", "sk_test_sync_all", `{"foo":1}`, "Idempotency-Key", "unconfirmed-2", "Prefer", "code=502"))
		wantProblem(t, rep, 422, "unknown_parameter", "foo")
		if rep.header.Get("Preference-Applied") != "" {
			t.Errorf("a 422 names Preference-Applied %q", rep.header.Get("Preference-Applied"))
		}
	})
}

// TestSandboxesInParallel: two tests, each in a sandbox of its own, freeze their clocks
// and see neither the other's clock nor journal.
func TestSandboxesInParallel(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1})
	for i, at := range []string{"start+45s", "start+90s"} {
		t.Run(at, func(t *testing.T) {
			t.Parallel()
			_, sb := e.postSandbox(t, "sk_test_sync_all", `{}`, "parallel-"+at)
			key := sb.Keys[0].Key
			for range 20 {
				e.setClock(t, key, at)
				if got := e.readClock(t, key); got.StartedAt != sb.StartedAt {
					t.Fatalf("the sandbox's clock started at %s", got.StartedAt)
				}
				want := []string{"ord_sync_0006 ord_sync_0005 ord_sync_0004 ord_sync_0003 ord_sync_0001", "ord_sync_0006 ord_sync_0005 ord_sync_0004 ord_sync_0003 ord_sync_0002 ord_sync_0001"}[i]
				if got := listIDs(t, e.get(t, "/v1/orders", key)); got != want {
					t.Fatalf("at %s: %s, want %s", at, got, want)
				}
			}
			if j := e.journalOf(t, key, "limit=1000"); len(j.Data) != 60 { // its own 20 clock settings, 20 clock reads and 20 lists
				t.Errorf("the sandbox's journal holds %d entries, want its own 60", len(j.Data))
			}
		})
	}
}

// TestSandboxesAreForgotten: DELETE forgets a sandbox at once (its keys then answer 401),
// an idle one is forgotten an hour after its last request, and past the bound the least
// recently used goes first; the page counts them, never their keys.
func TestSandboxesAreForgotten(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, step: -1})
	_, a := e.postSandbox(t, "sk_test_sync_all", `{}`, "a")
	_, b := e.postSandbox(t, "sk_test_sync_all", `{"orders":[]}`, "b")
	wantProblem(t, e.do(t, newRequest(http.MethodDelete, "/v1/test_helpers/sandboxes/"+a.Account, b.Keys[0].Key)), 404, "not_found", "")
	wantProblem(t, e.do(t, newRequest(http.MethodDelete, "/v1/test_helpers/sandboxes/acct_sync", "sk_test_sync_all")), 404, "not_found", "")
	wantProblem(t, e.do(t, newRequest(http.MethodDelete, "/v1/test_helpers/sandboxes/"+a.Account+"?x", a.Keys[0].Key)), 422, "unknown_parameter", "x")
	for _, tt := range []struct{ method, path, allow string }{
		{http.MethodGet, "/v1/test_helpers/sandboxes", "POST"},
		{http.MethodPost, "/v1/test_helpers/sandboxes/" + a.Account, "DELETE"},
	} {
		rep := e.do(t, newRequest(tt.method, tt.path, a.Keys[0].Key))
		if p := wantProblem(t, rep, 405, "method_not_allowed", ""); rep.header.Get("Allow") != tt.allow || p.Detail != "This path answers "+tt.allow+" only." {
			t.Errorf("%s %s: Allow %q, detail %q", tt.method, tt.path, rep.header.Get("Allow"), p.Detail)
		}
	}
	if rep := e.do(t, newBodyRequest(http.MethodDelete, "/v1/test_helpers/sandboxes/"+a.Account, a.Keys[0].Key, "ignored", "Idempotency-Key", "ignored too")); rep.status != 204 || len(rep.body) != 0 {
		t.Fatalf("DELETE with its key: %s", rep)
	}
	for _, target := range []string{"/v1/orders", "/v1/test_helpers/clock"} {
		wantProblem(t, e.get(t, target, a.Keys[0].Key), 401, "invalid_api_key", "")
	}
	wantProblem(t, e.do(t, newRequest(http.MethodDelete, "/v1/test_helpers/sandboxes/"+a.Account, a.Keys[0].Key)), 401, "invalid_api_key", "")
	if page := string(e.get(t, "/", "").body); !strings.Contains(page, "Sandboxes: 1 made") || strings.Contains(page, b.Keys[0].Key) {
		t.Errorf("the page does not count the one sandbox, or shows its key")
	}
	// Idle: an hour after its last request, by the wall clock.
	e.clock.advance(59 * time.Minute)
	e.get(t, "/v1/orders", b.Keys[0].Key)
	e.clock.advance(59 * time.Minute)
	if rep := e.get(t, "/v1/orders", b.Keys[0].Key); rep.status != 200 {
		t.Fatalf("used 59 minutes ago: %s", rep)
	}
	e.clock.advance(time.Hour)
	wantProblem(t, e.get(t, "/v1/orders", b.Keys[0].Key), 401, "invalid_api_key", "")
	// Past the bound, the least recently used goes first.
	setMaxSandboxes(e, 3)
	var keys []string
	for i := range 3 {
		_, s := e.postSandbox(t, "sk_test_sync_all", `{"orders":[]}`, fmt.Sprint("lru-", i))
		keys = append(keys, s.Keys[0].Key)
		e.clock.advance(time.Second)
	}
	e.get(t, "/v1/orders", keys[0]) // the first is used again: the second is the least recently used
	e.clock.advance(time.Second)
	e.postSandbox(t, "sk_test_sync_all", `{"orders":[]}`, "lru-3")
	for i, want := range []int{200, 401, 200} {
		if rep := e.get(t, "/v1/orders", keys[i]); rep.status != want {
			t.Errorf("sandbox %d after a fourth past a bound of 3: %d, want %d", i, rep.status, want)
		}
	}
	if n := e.srv.registry.count(e.clock.now()); n != 3 {
		t.Errorf("%d sandboxes kept, want 3", n)
	}
}

// TestCopiesOfOneInstantShareTheirData: two copies of acct_sync made in the same second hold
// one copy of its data (read against the same start instant, it is the same, and never
// edited), yet each is its own account: its cursors, clock and journal.
func TestCopiesOfOneInstantShareTheirData(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, step: -1})
	_, a := e.postSandbox(t, "sk_test_sync_all", `{}`, "share-a")
	first := sandboxHoldings(e).data
	_, b := e.postSandbox(t, "sk_test_sync_all", `{}`, "share-b")
	second := sandboxHoldings(e).data - first
	ta, tb := sandboxTenant(e, a.Account), sandboxTenant(e, b.Account)
	if &ta.current().orders.block[0] != &tb.current().orders.block[0] || ta.current().orders.tag == tb.current().orders.tag || second >= first/2 {
		t.Errorf("the second copy does not share the first's data, or shares its cursor tag (the book counts %d bytes more for it, %d for the first)", second, first)
	}
	page := decodePage(t, e.get(t, "/v1/orders?limit=1", a.Keys[0].Key))
	wantProblem(t, e.get(t, "/v1/orders?limit=1&cursor="+url.QueryEscape(*page.Pagination.NextCursor), b.Keys[0].Key), 400, "invalid_cursor", "cursor")
	e.setClock(t, a.Keys[0].Key, "start+90s")
	if got, other := listIDs(t, e.get(t, "/v1/orders", a.Keys[0].Key)), listIDs(t, e.get(t, "/v1/orders", b.Keys[0].Key)); got == other {
		t.Errorf("a clock frozen in one copy moved the other: both list %s", got)
	}
	if ja, jb := e.journalOf(t, a.Keys[0].Key, ""), e.journalOf(t, b.Keys[0].Key, ""); len(ja.Data) != 3 || len(jb.Data) != 2 {
		t.Errorf("journals of %d and %d entries, want 3 and 2", len(ja.Data), len(jb.Data))
	}
	// A copy made at another second is built anew, at its own start.
	e.clock.advance(time.Second)
	_, c := e.postSandbox(t, "sk_test_sync_all", `{}`, "share-c")
	if tc := sandboxTenant(e, c.Account); &tc.current().orders.block[0] == &ta.current().orders.block[0] || !tc.start.After(ta.start) {
		t.Error("a copy of another start instant shares the data of the first")
	}
}

// TestSandboxReplaysTheSyncFindings: a copy of acct_sync is the whole order-sync rehearsal for
// one test: the README's watermark sync gets exactly the findings it gets on the dataset's.
func TestSandboxReplaysTheSyncFindings(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{step: -1, rate: -1})
	_, sb := e.postSandbox(t, "sk_test_sync_all", `{}`, "sync")
	for _, key := range []string{"sk_test_sync_all", sb.Keys[0].Key} {
		wm := "2000-01-01T00:00:00Z"
		for _, s := range []int{0, 30, 60, 90, 120} {
			rep := e.get(t, "/v1/orders?limit=100&created_from="+wm, key, "Prefer", fmt.Sprintf(`clock="start+%ds", run="watermark"`, s))
			for _, o := range decodePage(t, rep).Data {
				wm = max(wm, o.CreatedAt)
			}
		}
	}
	// The dataset's journal holds the making first: its sync is seqs 2 to 6, the copy's 1 to 5.
	dataset, copied := e.findingsOf(t, "sk_test_sync_all", "run=watermark"), e.findingsOf(t, sb.Keys[0].Key, "run=watermark")
	if dataset.summary() != "missed_import ord_sync_0002 [2 6]\nstale_order ord_sync_0001 [2 6]" || copied.summary() != "missed_import ord_sync_0002 [1 5]\nstale_order ord_sync_0001 [1 5]" {
		t.Errorf("the copy's findings:\n%s\nthe dataset's:\n%s", copied.summary(), dataset.summary())
	}
}

// TestSandboxKeysAreNeverShown: a key made for a sandbox is in its answer only: not in the
// log, the journal (its mask), the HAR or the page.
func TestSandboxKeysAreNeverShown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1})
	_, sb := e.postSandbox(t, "sk_test_sync_all", `{}`, "secret")
	key := sb.Keys[0].Key
	e.get(t, "/v1/orders", key)
	e.get(t, "/v1/orders", key, "Prefer", "code=503")
	places := map[string]string{
		"the log":     e.logs.String(),
		"the journal": string(e.get(t, "/v1/test_helpers/requests", key).body),
		"the HAR":     string(e.get(t, "/v1/test_helpers/requests?format=har", key).body),
		"the page":    string(e.get(t, "/", "").body),
		"findings":    string(e.get(t, "/v1/test_helpers/findings", key).body),
	}
	for where, text := range places {
		if strings.Contains(text, key) || strings.Contains(text, key[8:]) {
			t.Errorf("%s shows the sandbox's key", where)
		}
	}
	if !strings.Contains(places["the journal"], `"key":"`+keyMask(key)+`"`) {
		t.Errorf("the journal does not name the key by its mask %s", keyMask(key))
	}
}

// TestSandboxesUnderRacingRequests: makes, reads and deletes at once (run with -race): a
// read answers as its sandbox stands, or 401 once it is gone; nothing else.
func TestSandboxesUnderRacingRequests(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, quiet: true})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 25 {
				r := httptest.NewRecorder()
				e.h.ServeHTTP(r, newBodyRequest(http.MethodPost, "/v1/test_helpers/sandboxes", "sk_test_sync_all", `{}`, "Idempotency-Key", fmt.Sprint("race-", w, "-", i)))
				var sb sandboxOut
				if r.Code != 201 || json.Unmarshal(r.Body.Bytes(), &sb) != nil {
					t.Errorf("make: %d %s", r.Code, r.Body)
					return
				}
				key := sb.Keys[0].Key
				var reads sync.WaitGroup
				reads.Add(1)
				go func() {
					defer reads.Done()
					for range 10 {
						r := httptest.NewRecorder()
						e.h.ServeHTTP(r, newRequest(http.MethodGet, "/v1/orders", key))
						if r.Code != 200 && r.Code != 401 {
							t.Errorf("a read racing a delete: %d %s", r.Code, r.Body)
						}
					}
				}()
				d := httptest.NewRecorder()
				e.h.ServeHTTP(d, newRequest(http.MethodDelete, "/v1/test_helpers/sandboxes/"+sb.Account, key))
				if d.Code != 204 {
					t.Errorf("delete: %d %s", d.Code, d.Body)
				}
				reads.Wait()
			}
		}()
	}
	wg.Wait()
	if n := e.srv.registry.count(e.clock.now()); n != 0 {
		t.Errorf("%d sandboxes left after every one was deleted", n)
	}
}

// holdings is what the registry hold of the sandboxes: how many are kept, and the bytes of
// their data, journals and stored answers as the registry count them (the dataset's tenants
// left out).
type holdings struct {
	sandboxes               int
	data, journals, answers int64
}

// pipedRequest is a request whose body the test writes when it chooses: the server has
// checked everything before the body (the key among them) once ready is closed, and waits
// for the body there.
type pipedRequest struct {
	*http.Request
	body  *io.PipeWriter
	ready chan struct{}
}

// newPipedRequest is a request of method, target and key whose body comes later.
func newPipedRequest(method, target, key string, headerPairs ...string) *pipedRequest {
	pr, pw := io.Pipe()
	p := &pipedRequest{Request: newRequest(method, target, key, headerPairs...), body: pw, ready: make(chan struct{})}
	p.Body, p.ContentLength = &firstRead{r: pr, ready: p.ready}, -1
	return p
}

// firstRead closes ready at its first Read.
type firstRead struct {
	r     io.ReadCloser
	ready chan struct{}
	once  sync.Once
}

func (f *firstRead) Read(b []byte) (int, error) {
	f.once.Do(func() { close(f.ready) })
	return f.r.Read(b)
}

func (f *firstRead) Close() error { return f.r.Close() }

// serveAsync serves r on its own goroutine and hands its reply on, checked as every reply is.
func (e *env) serveAsync(t testing.TB, r *http.Request) <-chan reply {
	done := make(chan reply, 1)
	go func() {
		rec := httptest.NewRecorder()
		e.h.ServeHTTP(rec, r)
		done <- reply{status: rec.Code, header: rec.Header(), body: rec.Body.Bytes()}
	}()
	return done
}

// within waits for a reply, and fails the test when none comes within a minute: what never
// comes is a deadlock, not a slow machine.
func within(t testing.TB, what string, c <-chan reply) reply {
	t.Helper()
	select {
	case rep := <-c:
		return rep
	case <-time.After(time.Minute):
		t.Fatalf("%s: no answer within a minute (a deadlock)", what)
		return reply{}
	}
}

// sandboxRecords is a body of n orders (each about 250 bytes) and as many shipments, each
// linking its order.
func sandboxRecords(n int) string {
	var orders, shipments []string
	for i := range n {
		orders = append(orders, fmt.Sprintf(`{"id":"ord_%d","merchant_reference":"R-%d","platform":"ebay","status":"unfulfilled","created_at":"start-%dm"}`, i, i, i+1))
		shipments = append(shipments, fmt.Sprintf(`{"id":"shp_%d","reference":"S-%d","tracking_number":"T%d","order_id":"ord_%d","events":[{"after":"%ds","status":"in_transit","description":"Departed"}]}`, i, i, i, i, i))
	}
	return `{"orders":[` + strings.Join(orders, ",") + `],"shipments":[` + strings.Join(shipments, ",") + `]}`
}

// TestForgottenSandboxesHoldNothing: whatever a sandbox did before it was forgotten (by its
// DELETE, as the least recently used past the bound, or idle for its hour), the registry hold
// nothing of it afterwards: no journal, no stored answer, no bytes of data. Its DELETE as
// its first journaled request opened a journal of its own that nothing freed (0.67 MiB a
// cycle of a 256 KiB sandbox).
func TestForgottenSandboxesHoldNothing(t *testing.T) {
	t.Parallel()
	body := sandboxRecords(100)
	del := func(t *testing.T, e *env, sb sandboxOut) {
		if rep := e.do(t, newRequest(http.MethodDelete, "/v1/test_helpers/sandboxes/"+sb.Account, sb.Keys[0].Key)); rep.status != 204 {
			t.Fatalf("DELETE: %s", rep)
		}
	}
	for _, tt := range []struct {
		name   string
		before func(t *testing.T, e *env, key string)
		forget func(t *testing.T, e *env, sb sandboxOut)
	}{
		{"its DELETE first", func(*testing.T, *env, string) {}, del},
		{"a read, then its DELETE", func(t *testing.T, e *env, key string) { e.get(t, "/v1/orders", key) }, del},
		{"a booking, then its DELETE", func(t *testing.T, e *env, key string) {
			if rep := e.book(t, key, `{"reference":"R"}`, "b"); rep.status != 201 {
				t.Fatalf("the booking: %s", rep)
			}
		}, del},
		{"a booking and a rehearsal, then the least recently used", func(t *testing.T, e *env, key string) {
			e.book(t, key, `{"reference":"R"}`, "b")
			e.get(t, "/v1/orders", key, "Prefer", "code=503; times=1")
		}, func(t *testing.T, e *env, sb sandboxOut) {
			setMaxSandboxes(e, 1)
			_, other := e.postSandbox(t, "sk_test_sync_all", `{"orders":[]}`, "other")
			wantProblem(t, e.get(t, "/v1/orders", sb.Keys[0].Key), 401, "invalid_api_key", "")
			del(t, e, other) // its only request: it leaves nothing either
		}},
		{"a read, then idle for its hour", func(t *testing.T, e *env, key string) { e.get(t, "/v1/orders", key) }, func(t *testing.T, e *env, sb sandboxOut) {
			e.clock.advance(sandboxIdle)
			wantProblem(t, e.get(t, "/v1/orders", sb.Keys[0].Key), 401, "invalid_api_key", "")
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, envOptions{rate: -1, step: -1, quiet: true})
			rep, sb := e.postSandbox(t, "sk_test_sync_all", body, "make")
			if rep.status != 201 {
				t.Fatalf("the sandbox: %s", rep)
			}
			if h := sandboxHoldings(e); h.sandboxes != 1 || h.data == 0 {
				t.Fatalf("the books hold %+v of one sandbox", h)
			}
			tt.before(t, e, sb.Keys[0].Key)
			tt.forget(t, e, sb)
			if h := sandboxHoldings(e); h != (holdings{}) {
				t.Errorf("once forgotten, the books hold %+v of it", h)
			}
		})
	}
}

// TestLateRequestsOfAForgottenSandbox: a request whose key was checked before its sandbox's
// DELETE, and whose body comes after the 204, adds nothing to the registry: a read's entry is
// not kept, and a booking writes and stores nothing and answers 401 invalid_api_key (it once
// answered 201 and registered the forgotten store again, 0.85 MiB a cycle).
func TestLateRequestsOfAForgottenSandbox(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, method, target, body string
		headers                    []string
		status                     int
		code                       string
	}{
		{"a read", http.MethodGet, "/v1/orders", "", nil, 200, ""},
		{"a booking", http.MethodPost, "/v1/test_helpers/shipments", `{"reference":"R"}`, []string{"Idempotency-Key", "late", "Content-Type", "application/json"}, 401, "invalid_api_key"},
		{"a sandbox made with its key", http.MethodPost, "/v1/test_helpers/sandboxes", `{"template":"acct_sync"}`, []string{"Idempotency-Key", "late", "Content-Type", "application/json"}, 401, "invalid_api_key"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, envOptions{rate: -1, step: -1, quiet: true})
			_, sb := e.postSandbox(t, "sk_test_sync_all", `{}`, "make")
			key := sb.Keys[0].Key
			late := newPipedRequest(tt.method, tt.target, key, tt.headers...)
			answer := e.serveAsync(t, late.Request)
			<-late.ready // its key is checked
			if rep := e.do(t, newRequest(http.MethodDelete, "/v1/test_helpers/sandboxes/"+sb.Account, key)); rep.status != 204 {
				t.Fatalf("DELETE: %s", rep)
			}
			go func() {
				io.WriteString(late.body, tt.body)
				late.body.Close()
			}()
			rep := within(t, tt.name, answer)
			checkResponse(t, late.Request, rep)
			if rep.status != tt.status {
				t.Fatalf("after the DELETE: %s, want %d", rep, tt.status)
			}
			if tt.code != "" {
				wantProblem(t, rep, tt.status, tt.code, "")
			}
			if h := sandboxHoldings(e); h != (holdings{}) {
				t.Errorf("the books hold %+v of the forgotten sandbox", h)
			}
		})
	}
}

// TestAWriteInFlightAcrossItsDelete: a write whose key was checked, and whose
// Idempotency-Key was claimed, before its sandbox's DELETE answers 401 invalid_api_key
// whatever its own checks would have found in the data it still held (a second link, an
// unknown order, a fault of its body, a template it may not copy): nothing was written, and
// the answer says why. (It once answered 409 order_already_linked or 404: 202 of them in a
// 7-minute churn.) A write whose sandbox is gone before its claim never begins its work.
func TestAWriteInFlightAcrossItsDelete(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, target, body string
		without            int // what it answers with its sandbox kept
	}{
		{"a second link", "/v1/test_helpers/shipments", `{"reference":"R","order_id":"ord_sync_0001"}`, 409},
		{"an unknown order", "/v1/test_helpers/shipments", `{"reference":"R","order_id":"ord_nowhere"}`, 404},
		{"a fault of its body", "/v1/test_helpers/shipments", `{"reference":""}`, 422},
		{"a booking that would pass", "/v1/test_helpers/shipments", `{"reference":"R"}`, 201},
		{"a sandbox of a template it may not copy", "/v1/test_helpers/sandboxes", `{"template":"acct_nowhere"}`, 422},
		{"events for a shipment not created yet", "/v1/test_helpers/shipments/shp_sync_1/events", `{"status":"delivered"}`, 404},
		{"events for a shipment", "/v1/test_helpers/shipments/shp_sync_1/events", `{"status":"delivered"}`, 201},
	} {
		t.Run(caseName(tt.name), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, envOptions{rate: -1, step: -1, quiet: true})
			_, kept := e.postSandbox(t, "sk_test_sync_all", `{}`, "kept")
			later := []string{} // the shipment its records create at start+60s, found from then
			if tt.without == 201 && strings.HasSuffix(tt.target, "/events") {
				later = []string{"Prefer", `clock="start+2m"`}
			}
			if rep := e.do(t, newBodyRequest(http.MethodPost, tt.target, kept.Keys[0].Key, tt.body, append([]string{"Idempotency-Key", "w"}, later...)...)); rep.status != tt.without {
				t.Fatalf("with its sandbox kept: %s, want %d", rep, tt.without)
			}
			_, sb := e.postSandbox(t, "sk_test_sync_all", `{}`, "gone")
			key := sb.Keys[0].Key
			e.srv.registry.hooks.claimed = func(tn *tenant, _ string) {
				if tn.id.account == sb.Account {
					if rep := e.do(t, newRequest(http.MethodDelete, "/v1/test_helpers/sandboxes/"+sb.Account, key)); rep.status != 204 {
						t.Errorf("the DELETE: %s", rep)
					}
				}
			}
			rep := e.do(t, newBodyRequest(http.MethodPost, tt.target, key, tt.body, append([]string{"Idempotency-Key", "w"}, later...)...))
			p := wantProblem(t, rep, 401, "invalid_api_key", "")
			if !strings.Contains(p.Detail, "deleted or forgotten while this request ran, and nothing was written") {
				t.Errorf("the detail does not say why: %q", p.Detail)
			}
			if h := sandboxHoldings(e); h.sandboxes != 1 {
				t.Errorf("the books hold %d sandboxes, want the kept one", h.sandboxes)
			}
		})
	}
	// Its sandbox gone before it claims its key: the write's work never begins.
	e := newEnv(t, envOptions{rate: -1, step: -1, quiet: true})
	_, sb := e.postSandbox(t, "sk_test_sync_all", `{}`, "make")
	var begun atomic.Int32
	e.srv.registry.hooks.claimed = func(*tenant, string) { begun.Add(1) }
	late := newPipedRequest(http.MethodPost, "/v1/test_helpers/shipments", sb.Keys[0].Key, "Idempotency-Key", "late", "Content-Type", "application/json")
	answer := e.serveAsync(t, late.Request)
	<-late.ready
	if rep := e.do(t, newRequest(http.MethodDelete, "/v1/test_helpers/sandboxes/"+sb.Account, sb.Keys[0].Key)); rep.status != 204 {
		t.Fatalf("DELETE: %s", rep)
	}
	go func() { io.WriteString(late.body, `{"reference":"R"}`); late.body.Close() }()
	wantProblem(t, within(t, "the late write", answer), 401, "invalid_api_key", "")
	if n := begun.Load(); n != 0 {
		t.Errorf("the write of a forgotten sandbox claimed its key and began its work (%d)", n)
	}
}

// TestForgettingRacesAFirstWrite: a sandbox's first write, paused while it holds its
// tenant's lock to claim its Idempotency-Key, and the sandbox's DELETE, paused holding the
// registry's: both end, the DELETE 204 and the write 401 invalid_api_key, having written
// nothing. (Taken in two orders, the two locks once hung the process for good.)
func TestForgettingRacesAFirstWrite(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, step: -1, quiet: true})
	_, sb := e.postSandbox(t, "sk_test_sync_all", `{}`, "make")
	key := sb.Keys[0].Key
	claiming, release, forgetting := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var claimed, forgot sync.Once // each pauses its first step only
	e.srv.registry.hooks.claiming = func(*tenant) { claimed.Do(func() { close(claiming); <-release }) }
	e.srv.registry.hooks.forgetting = func(*tenant) { forgot.Do(func() { close(forgetting) }) }
	write := e.serveAsync(t, newBodyRequest(http.MethodPost, "/v1/test_helpers/shipments", key, `{"reference":"R","order_id":"ord_sync_0005"}`, "Idempotency-Key", "first"))
	<-claiming
	deletion := e.serveAsync(t, newRequest(http.MethodDelete, "/v1/test_helpers/sandboxes/"+sb.Account, key))
	<-forgetting
	close(release)
	if rep := within(t, "the DELETE", deletion); rep.status != 204 {
		t.Errorf("the DELETE: %s", rep)
	}
	rep := within(t, "the write", write)
	wantProblem(t, rep, 401, "invalid_api_key", "")
	if h := sandboxHoldings(e); h != (holdings{}) {
		t.Errorf("the books hold %+v of the forgotten sandbox", h)
	}
	for _, target := range []string{"/v1/orders", "/v1/test_helpers/clock"} { // and nothing answers for it
		wantProblem(t, e.get(t, target, key), 401, "invalid_api_key", "")
	}
}

// TestAKeyInProgressOutlivesTheList: an Idempotency-Key whose write is in progress is never
// what the tenant's list of 10,000 keys forgets: its repeat after 10,000 other writes is 409
// idempotency_key_in_use, not a second write under one key. Once every entry is in progress,
// the list takes them past its bound, and comes back to it as they end. The writes make
// sandboxes: the registry holds 10,000, and the 10,001st forgets the least recently used.
func TestAKeyInProgressOutlivesTheList(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, step: -1, quiet: true})
	held := map[string]chan struct{}{"slow": make(chan struct{}), "p-1": make(chan struct{}), "p-2": make(chan struct{}), "p-3": make(chan struct{})}
	var paused sync.WaitGroup
	e.srv.registry.hooks.claimed = func(_ *tenant, key string) { // each of these keys waits in progress until released
		if release, ok := held[key]; ok {
			paused.Done()
			<-release
		}
	}
	send := func(key string) <-chan reply {
		return e.serveAsync(t, newBodyRequest(http.MethodPost, "/v1/test_helpers/sandboxes", "sk_test_other_all", `{}`, "Idempotency-Key", key))
	}
	paused.Add(1)
	first := send("slow")
	paused.Wait()
	tenant := e.sb.tenants.byID[tenantID{"acct_other", "test"}]
	oldest := "" // the key of the sandbox made first, then used least recently
	for i := range maxStoredAnswers {
		rep, made := e.postSandbox(t, "sk_test_other_all", `{"orders":[]}`, fmt.Sprint("other-", i))
		if rep.status != 201 {
			t.Fatalf("write %d: %s", i, rep)
		}
		if i == 0 {
			oldest = made.Keys[0].Key
		}
	}
	if n := answersHeld(tenant); n != maxStoredAnswers {
		t.Errorf("with one write in progress, the list holds %d keys, want %d", n, maxStoredAnswers)
	}
	wantProblem(t, within(t, "the repeat", send("slow")), 409, "idempotency_key_in_use", "")
	close(held["slow"])
	if rep := within(t, "the slow write", first); rep.status != 201 || rep.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("the slow write: %s", rep)
	}
	if rep := within(t, "the repeat", send("slow")); rep.status != 201 || rep.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("its repeat once done: %s", rep)
	}
	if n := e.srv.registry.count(e.clock.now()); n != maxSandboxes || maxSandboxes != maxStoredAnswers {
		t.Errorf("%d sandboxes kept of %d made, want %d", n, maxStoredAnswers+1, maxSandboxes)
	}
	wantProblem(t, e.get(t, "/v1/orders", oldest), 401, "invalid_api_key", "") // the least recently used
	// Every entry in progress: a list of 2 holds 3, then comes back to 2 as they end.
	tenant.mu.Lock()
	tenant.answers.max = 2
	tenant.mu.Unlock()
	var answers []<-chan reply
	for _, key := range []string{"p-1", "p-2", "p-3"} {
		paused.Add(1)
		answers = append(answers, send(key))
	}
	paused.Wait()
	if n := answersHeld(tenant); n != 3 {
		t.Errorf("three writes in progress in a list of 2: it holds %d", n)
	}
	for i, key := range []string{"p-1", "p-2", "p-3"} {
		close(held[key])
		if rep := within(t, key, answers[i]); rep.status != 201 {
			t.Errorf("%s: %s", key, rep)
		}
	}
	if n := answersHeld(tenant); n != 2 {
		t.Errorf("once they ended, the list of 2 holds %d", n)
	}
}

// TestCopiesWithinTheirHeap: 10,000 copies of acct_sync hold at most 100 MiB (the contract),
// each built anew (made at another second, none shares another's data): what a copy holds
// is linear in copies, so 2,000 hold at most 20 MiB. Not parallel: it measures the heap.
// (Each copy's orders filed at its creation made 10,000 hold 104 MiB.)
func TestCopiesWithinTheirHeap(t *testing.T) {
	const copies = 2000
	e := newEnv(t, envOptions{rate: -1, quiet: true, journal: -1, step: time.Microsecond})
	held := heapGrowth(t, e.h, copies, http.StatusCreated, func(i int) *http.Request {
		clear(e.srv.registry.shared) // as if made at another second: built anew
		return newBodyRequest(http.MethodPost, "/v1/test_helpers/sandboxes", "sk_test_sync_all", `{}`, "Idempotency-Key", fmt.Sprint("copy-", i))
	})
	t.Logf("%d copies of acct_sync hold %d bytes of heap, %d each", copies, held, held/copies)
	if n := e.srv.registry.count(e.clock.now()); n != copies || len(e.srv.registry.shared) != 1 {
		t.Fatalf("%d sandboxes kept, %d shared data: the arrangement is not %d copies each built anew", n, len(e.srv.registry.shared), copies)
	}
	if held > copies*(100<<20)/maxSandboxes {
		t.Errorf("%d copies of acct_sync hold %d bytes of heap, over %d (10,000 within 100 MiB)", copies, held, copies*(100<<20)/maxSandboxes)
	}
}

// TestSharedCopiesAreCountedWhileHeld: copies of one template made in one second share their
// data, which the registry counts once while any copy holds it, whichever copies are forgotten
// first (once only the first copy counted it, and forgetting it let the others count nothing).
func TestSharedCopiesAreCountedWhileHeld(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, step: -1, quiet: true})
	var copies []sandboxOut
	var first int64 // what the registry counts of the first copy alone
	for i := range 3 {
		_, sb := e.postSandbox(t, "sk_test_sync_all", `{}`, fmt.Sprint("copy-", i))
		copies = append(copies, sb)
		if i == 0 {
			first = sandboxHoldings(e).data
		}
	}
	// They share: the registry holds one data of the template, held by the three, and counts it
	// once (three copies built apart would count three times the first).
	if len(e.srv.registry.shared) != 1 {
		t.Fatalf("the book shares %d data, want the template's one", len(e.srv.registry.shared))
	}
	for _, sh := range e.srv.registry.shared {
		if sh.holders != 3 {
			t.Errorf("the shared data has %d holders, want the 3 copies", sh.holders)
		}
	}
	if held := sandboxHoldings(e).data; held > first+first/2 {
		t.Errorf("three copies count %d bytes of data, the first alone %d: they do not share it", held, first)
	}
	for i, sb := range copies {
		if rep := e.do(t, newRequest(http.MethodDelete, "/v1/test_helpers/sandboxes/"+sb.Account, sb.Keys[0].Key)); rep.status != 204 {
			t.Fatalf("DELETE: %s", rep)
		}
		if held := sandboxHoldings(e).data; i < 2 && held < first || i == 2 && held != 0 {
			t.Errorf("with %d of 3 copies forgotten, the book counts %d bytes of their data; the first copy alone counted %d", i+1, held, first)
		}
	}
}

// TestReplaysRaceTheirAnswer: one write sent five times at once (run with -race): one is
// the write, each other is 409 idempotency_key_in_use while it runs, or its answer again,
// byte for byte, once it is done.
func TestReplaysRaceTheirAnswer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, step: -1, quiet: true})
	for i := range 20 {
		idem := fmt.Sprint("race-", i)
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			answers []reply
		)
		for range 5 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					rep := <-e.serveAsync(t, newBodyRequest(http.MethodPost, "/v1/test_helpers/sandboxes", "sk_test_other_all", `{"orders":[]}`, "Idempotency-Key", idem))
					mu.Lock()
					answers = append(answers, rep)
					mu.Unlock()
					if rep.status != 409 {
						return
					}
				}
			}()
		}
		wg.Wait()
		var written []reply
		for _, rep := range answers {
			if rep.status == 201 && rep.header.Get("Idempotent-Replayed") == "" {
				written = append(written, rep)
			}
		}
		if len(written) != 1 {
			t.Fatalf("%d of the repeats wrote, want one", len(written))
		}
		for _, rep := range answers {
			switch {
			case rep.status == 409 && bytes.Contains(rep.body, []byte(`"code":"idempotency_key_in_use"`)):
			case rep.status == 201 && (rep.header.Get("Idempotent-Replayed") == "" || rep.header.Get("Idempotent-Replayed") == "true" && bytes.Equal(rep.body, written[0].body)):
			default:
				t.Errorf("a repeat racing the write %s answered %s", written[0], rep)
			}
		}
	}
}

// TestStoredAnswersWithinTheirBound: past the 64 MiB that every tenant's stored answers
// hold together, the oldest answers of the tenant that holds the most go first, and the
// bound holds after every write; the others' answers stay, and a forgotten key's repeat is
// a new write.
func TestStoredAnswersWithinTheirBound(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, step: -1, quiet: true})
	_, big := e.postSandbox(t, "sk_test_sync_all", `{"orders":[]}`, "big")
	key := big.Keys[0].Key
	description := strings.Repeat("x", 60000)
	var events []string
	for k := range 4 {
		events = append(events, fmt.Sprintf(`{"timestamp":"2026-11-01T00:00:0%dZ","status":"in_transit","description":"%s"}`, k, description))
	}
	body := `{"reference":"R","events":[` + strings.Join(events, ",") + `]}`
	n := 0
	for ; n < 300; n++ {
		if rep := e.book(t, key, body, fmt.Sprint("b-", n)); rep.status != 201 {
			t.Fatalf("booking %d: %s", n, rep)
		}
		if total := storedAnswerBytes(e); total > maxStoredAnswerBytes {
			t.Fatalf("after %d bookings the stored answers hold %d bytes, over %d", n+1, total, maxStoredAnswerBytes)
		}
	}
	if total := storedAnswerBytes(e); total < maxStoredAnswerBytes*9/10 {
		t.Fatalf("the arrangement: %d bookings store %d bytes, short of the bound", n, total)
	}
	if rep := e.book(t, key, body, fmt.Sprint("b-", n-1)); rep.status != 201 || rep.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the newest booking's repeat: %d, replayed %q", rep.status, rep.header.Get("Idempotent-Replayed"))
	}
	if rep := e.book(t, key, body, "b-0"); rep.status != 201 || rep.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("the oldest booking's repeat, its answer forgotten: %d, replayed %q, want a new write", rep.status, rep.header.Get("Idempotent-Replayed"))
	}
	if rep, _ := e.postSandbox(t, "sk_test_sync_all", `{"orders":[]}`, "big"); rep.status != 201 || rep.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("another tenant's answer, stored first: %d, replayed %q", rep.status, rep.header.Get("Idempotent-Replayed"))
	}
}

// TestLRU: the one bounded least-recently-used list (the sandboxes, each tenant's stored
// answers and rehearsals counted): recency, the count's bound, weights, and pinned entries,
// which it never forgets, holding them past its bound when every entry is pinned.
func TestLRU(t *testing.T) {
	t.Parallel()
	order := func(l *lru[string, int]) string {
		var keys []string
		for k := range l.olderFirst() {
			keys = append(keys, k)
		}
		return strings.Join(keys, " ")
	}
	t.Run("recency and the bound", func(t *testing.T) {
		l := lru[string, int]{max: 3}
		if l.len() != 0 || order(&l) != "" || l.trim() != 0 || l.byKey != nil || l.root != nil {
			t.Fatal("an empty list is not empty, or takes memory before its first entry")
		}
		for i, k := range []string{"a", "b", "c", "d"} {
			l.add(k, i, int64(10*(i+1)), false)
		}
		l.get("a") // a is now the most recently used: b is the least
		if got := order(&l); got != "b c d a" || l.weight != 100 {
			t.Fatalf("older first: %q, weight %d; want \"b c d a\", 100", got, l.weight)
		}
		if forgot := l.trim(); forgot != 20 || order(&l) != "c d a" || l.weight != 80 {
			t.Errorf("trimmed to 3: forgot %d, left %q weighing %d; want 20, \"c d a\", 80", forgot, order(&l), l.weight)
		}
		if v, ok := l.peek("c"); !ok || v != 2 || order(&l) != "c d a" {
			t.Errorf("peek: %d %v, and it moved the order: %q", v, ok, order(&l))
		}
		l.replace("c", 7, 5, false)
		if v, _ := l.get("c"); v != 7 || l.weight != 55 {
			t.Errorf("set: value %d, weight %d; want 7, 55", v, l.weight)
		}
		if v, w, ok := l.remove("d"); !ok || v != 3 || w != 40 || l.len() != 2 || l.weight != 15 {
			t.Errorf("remove: %d %d %v, then %d held weighing %d", v, w, ok, l.len(), l.weight)
		}
		if _, _, ok := l.remove("d"); ok {
			t.Error("a key removed twice")
		}
	})
	t.Run("pinned entries", func(t *testing.T) {
		l := lru[string, int]{max: 2}
		l.add("a", 0, 1, true)
		l.add("b", 0, 1, true)
		l.add("c", 0, 1, true)
		if l.trim() != 0 || l.len() != 3 {
			t.Fatalf("every entry pinned: it holds %d, want all 3", l.len())
		}
		if k, _, ok := l.oldest(); ok {
			t.Errorf("the oldest not pinned is %q, with every entry pinned", k)
		}
		l.pin("b", false)
		if k, _, _ := l.oldest(); k != "b" {
			t.Errorf("the oldest not pinned is %q, want b (a is older, and pinned)", k)
		}
		if l.trim(); order(&l) != "a c" {
			t.Errorf("trimmed with b unpinned: %q, want a c", order(&l))
		}
		l.replace("a", 0, 1, false)
		l.add("d", 0, 1, false)
		if l.shed(10); order(&l) != "c" || l.weight != 1 {
			t.Errorf("shed all it can: %q left weighing %d, want the pinned c", order(&l), l.weight)
		}
		l.clear()
		if l.len() != 0 || l.weight != 0 || l.max != 2 || l.byKey != nil || l.root != nil {
			t.Errorf("cleared: %d held, weight %d, max %d, or memory kept", l.len(), l.weight, l.max)
		}
	})
}

// TestEveryIndexFieldIsCounted: each field of the indexes that holds heap (a slice, a map, a
// string, one of those within) adds to the bytes the registry counts when it holds something, so
// that a field added later cannot escape the sandboxes' bound; the fields that hold none, or
// hold what another counts, are named with the reason.
func TestEveryIndexFieldIsCounted(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		value  any // a pointer to a zero value
		bytes  func() int64
		exempt map[string]string
	}{
		{"orderIndex", &orderIndex{}, nil, map[string]string{"recs": "the records, counted by whoever holds them (filedOrders.bytes)", "start": "no heap", "seeds": "no heap", "tag": "no heap"}},
		{"shipmentIndex", &shipmentIndex{}, nil, map[string]string{"start": "no heap", "held": "no heap: the count of what the others hold"}},
		{"shipment", &shipment{}, nil, map[string]string{"createdAt": "no heap", "dropped": "no heap"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			count := func() int64 {
				switch v := tt.value.(type) {
				case *orderIndex:
					return v.bytes()
				case *shipmentIndex:
					return v.bytes()
				case *shipment:
					return v.bytes()
				}
				t.Fatalf("no count for %T", tt.value)
				return 0
			}
			struc := reflect.ValueOf(tt.value).Elem()
			for i := range struc.NumField() {
				name := struc.Type().Field(i).Name
				if tt.exempt[name] != "" {
					continue
				}
				field := reflect.NewAt(struc.Field(i).Type(), unsafe.Pointer(struc.Field(i).UnsafeAddr())).Elem()
				before := count()
				saved := reflect.New(field.Type()).Elem()
				saved.Set(field)
				if !fill(field) {
					t.Errorf("%s.%s (%s) holds no heap the test knows how to fill: fill it, or name it exempt with the reason", tt.name, name, field.Type())
					continue
				}
				if after := count(); after <= before {
					t.Errorf("%s.%s holding something: bytes %d, as before (%d); count it in bytes()", tt.name, name, after, before)
				}
				field.Set(saved)
			}
		})
	}
}

// fill makes v, a field's zero value, hold something on the heap, and reports whether it
// knows how.
func fill(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.String:
		v.SetString("filled")
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 3, 3)
		for i := range 3 {
			fill(s.Index(i))
		}
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k)
		fill(e)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Array:
		filled := false
		for i := range v.Len() {
			filled = fill(v.Index(i)) || filled
		}
		return filled
	case reflect.Struct:
		filled := false
		for i := range v.NumField() {
			f := v.Field(i)
			filled = fill(reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem()) || filled
		}
		return filled
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem())
	default:
		return false
	}
	return true
}

// (What the tests read of the registry.)

// sandboxHoldings is what the registry holds of the sandboxes: what it counts in all, less what
// the dataset's tenants hold, so that what nothing kept holds shows too.
func sandboxHoldings(e *env) holdings {
	b := e.srv.registry
	b.mu.Lock()
	defer b.mu.Unlock()
	h := holdings{sandboxes: b.sandboxes.len(), data: b.sandboxes.weight + b.sharedBytes, journals: b.journalTotal.Load(), answers: b.answerTotal.Load()}
	for _, t := range b.dataset {
		h.journals -= t.journalBytes.Load()
		h.answers -= t.answerBytes.Load()
	}
	return h
}

// sandboxTenant is the tenant of the sandbox of this account, nil when the registry keeps none.
func sandboxTenant(e *env, account string) *tenant {
	e.srv.registry.mu.Lock()
	defer e.srv.registry.mu.Unlock()
	t, _ := e.srv.registry.sandboxes.peek(account)
	return t
}

func setMaxSandboxes(e *env, n int) {
	e.srv.registry.mu.Lock()
	defer e.srv.registry.mu.Unlock()
	e.srv.registry.sandboxes.max = n
}

// answerHeld reports whether t holds something under the Idempotency-Key key.
func answerHeld(t *tenant, key string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.answers.peek(key)
	return ok
}

// answersHeld is how many Idempotency-Keys t holds.
func answersHeld(t *tenant) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.answers.len()
}

// storedAnswerBytes is what every tenant's stored answers hold, as the registry counts them.
func storedAnswerBytes(e *env) int64 { return e.srv.registry.answerTotal.Load() }

// FuzzSandboxBody: any body of POST /v1/test_helpers/sandboxes answers 201, or 400, 409 or
// 422 as a problem the document allows, never a 500 or a panic; a refused body makes
// nothing, and a sandbox made answers its own reads.
func FuzzSandboxBody(f *testing.F) {
	e := newEnv(f, envOptions{rate: -1, quiet: true, journal: -1, step: -1}) // a frozen clock: no sandbox goes idle
	for _, body := range []string{
		`{}`, `{"template":"acct_sync"}`, `{"template":"acct_sandbox","keys":[{"scopes":["orders:read"],"expires_at":"2099-01-01T00:00:00Z","revoked":true}]}`,
		`{"orders":[{"id":"ord_1","merchant_reference":"R","platform":"ebay","status":"unfulfilled","created_at":"start-1h","imported_at":"start+30s","changes":[{"status":"fulfilled","at":"start+2m"}]}],` +
			`"shipments":[{"id":"shp_1","reference":"S","tracking_number":"T1","order_id":"ord_1","created_at":"start+60s","events":[{"after":"60s","status":"in_transit","description":"D"},{"timestamp":"x","status":"failure","description":"E"}]}]}`,
		`{"shipments":[{"id":"a","reference":"b","order_id":"c"}]}`, `{"orders":[],"keys":[]}`, `[]`, `{"template":1}`, "{\"t\":\"\xff\"}", `{"Template":"acct_sync","template":"acct_sync"}`,
	} {
		f.Add(body)
	}
	n := 0
	f.Fuzz(func(t *testing.T, body string) {
		n++
		before := e.srv.registry.count(e.clock.now())
		r := newBodyRequest(http.MethodPost, "/v1/test_helpers/sandboxes", "sk_test_sync_all", body, "Content-Type", "application/json", "Idempotency-Key", "fuzz-"+strconv.Itoa(n))
		rep := e.do(t, r) // checks the answer against the document
		switch rep.status {
		case http.StatusCreated:
			var sb sandboxOut
			if err := json.Unmarshal(rep.body, &sb); err != nil || len(sb.Keys) == 0 {
				t.Fatalf("201 %s: %v", rep.body, err)
			}
			e.do(t, newRequest(http.MethodGet, "/v1/orders", sb.Keys[0].Key))
			e.do(t, newRequest(http.MethodDelete, "/v1/test_helpers/sandboxes/"+sb.Account, sb.Keys[0].Key))
		case http.StatusBadRequest, http.StatusConflict, http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity:
			if after := e.srv.registry.count(e.clock.now()); after != before {
				t.Fatalf("a refused body (%s) made a sandbox", rep)
			}
		default:
			t.Fatalf("%q = %s", body, rep)
		}
	})
}

// BenchmarkGetOrderBesideSandboxes: GET by id with a dataset key, with 10,000 copies of
// acct_sync made first: what sandboxes cost the requests that use none of them.
func BenchmarkGetOrderBesideSandboxes(b *testing.B) {
	e := benchEnv(b, 0)
	for i := range maxSandboxes {
		w := &benchWriter{h: http.Header{}}
		e.h.ServeHTTP(w, newBodyRequest(http.MethodPost, "/v1/test_helpers/sandboxes", "sk_test_sync_all", `{}`, "Idempotency-Key", strconv.Itoa(i)))
		if w.status != http.StatusCreated {
			b.Fatalf("%d %s", w.status, w.buf)
		}
	}
	benchServe(b, e.h, newRequest("GET", "/v1/orders/ord_sbx_0001", "sk_test_sandbox_all"), 200)
}

// BenchmarkMakeSandbox: POST /v1/test_helpers/sandboxes through the whole chain: a copy of
// acct_sync and of acct_sandbox (the contract: within 5 ms), of a template of 10,000 orders
// (within 50 ms), and of a body of records just under 256 KiB (within 100 ms); and the heap
// that 10,000 copies of acct_sync hold (MiB/10000-copies, the contract: at most 100; run it
// with -benchtime 1x). Each copy is built anew, as a copy made at another second than the
// last is: copies of one second share their data (TestCopiesOfOneInstantShareTheirData).
func BenchmarkMakeSandbox(b *testing.B) {
	var orders, shipments []string
	size := len(`{"orders":[],"shipments":[]}`)
	for i := 0; ; i++ {
		o := fmt.Sprintf(`{"id":"ord_%05d","merchant_reference":"R-%05d","platform":"ebay","status":"unfulfilled","created_at":"start-%dm","changes":[{"status":"fulfilled","at":"start+%ds"}]}`, i, i, i, i+1)
		sh := fmt.Sprintf(`{"id":"shp_%05d","reference":"S-%05d","tracking_number":"T%05d","order_id":"ord_%05d","events":[{"after":"%ds","status":"in_transit","description":"Departed facility","location":"Leeds, GB"}]}`, i, i, i, i, i)
		if size+len(o)+len(sh)+2 > maxBodyBytes {
			break
		}
		orders, shipments, size = append(orders, o), append(shipments, sh), size+len(o)+len(sh)+2
	}
	large := `{"orders":[` + strings.Join(orders, ",") + `],"shipments":[` + strings.Join(shipments, ",") + `]}`
	for _, tt := range []struct {
		name, key, body string
		seed            int
	}{
		{"copy_of_acct_sync", "sk_test_sync_all", `{}`, 0},
		{"copy_of_acct_sandbox", "sk_test_sandbox_all", `{}`, 0},
		{"copy_of_10000_orders", "sk_test_sandbox_all", `{}`, maxSandboxRecords - 1}, // acct_sandbox's one and 9,999 seeded (the contract: within 50 ms)
		{fmt.Sprintf("records_%dKiB", len(large)>>10), "sk_test_sandbox_all", large, 0},
	} {
		b.Run(tt.name, func(b *testing.B) { // a copy built anew each time, as one made at another second is
			e := benchEnv(b, tt.seed)
			n := 0
			b.ReportAllocs()
			for b.Loop() {
				n++
				clear(e.srv.registry.shared)
				w := &benchWriter{h: http.Header{}}
				e.h.ServeHTTP(w, newBodyRequest(http.MethodPost, "/v1/test_helpers/sandboxes", tt.key, tt.body, "Idempotency-Key", strconv.Itoa(n)))
				if w.status != http.StatusCreated {
					b.Fatalf("%d %s", w.status, w.buf)
				}
			}
		})
	}
	b.Run("heap_of_10000_copies_of_acct_sync", func(b *testing.B) { // each built anew: none shares another's data
		for b.Loop() {
			e := benchEnv(b, 0)
			before := heapAfterGC()
			for i := range maxSandboxes {
				clear(e.srv.registry.shared)
				w := &benchWriter{h: http.Header{}}
				e.h.ServeHTTP(w, newBodyRequest(http.MethodPost, "/v1/test_helpers/sandboxes", "sk_test_sync_all", `{}`, "Idempotency-Key", strconv.Itoa(i)))
				if w.status != http.StatusCreated {
					b.Fatalf("%d %s", w.status, w.buf)
				}
			}
			b.ReportMetric(float64(heapAfterGC()-before)/(1<<20), "MiB/10000-copies")
			runtime.KeepAlive(e)
		}
	})
}

// ===== auth.go: Exams, an attempt and its grade; main.go, serve: the exam routes =====

// examStartedOut is POST /v1/test_helpers/exams's 201.
type examStartedOut struct {
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
}

// gradeOut is an attempt's grade as GET /v1/test_helpers/exams/{id} answers it.
type gradeOut struct {
	ID        string     `json:"id"`
	Exam      string     `json:"exam"`
	Revision  int        `json:"revision"`
	Variant   int64      `json:"variant"`
	Scale     int        `json:"scale"`
	Account   string     `json:"account"`
	State     string     `json:"state"`
	StartedAt string     `json:"started_at"`
	Now       string     `json:"now"`
	Deadline  string     `json:"deadline"`
	GradedAt  *string    `json:"graded_at"`
	Passed    *bool      `json:"passed"`
	Score     *string    `json:"score"`
	Checks    []checkOut `json:"checks"`
}

type checkOut struct {
	ID       string   `json:"id"`
	Title    string   `json:"title"`
	Result   string   `json:"result"`
	Detail   *string  `json:"detail"`
	Requests []uint64 `json:"requests"`
	MarginMS *int64   `json:"margin_ms"`
}

// failing is the ids of the checks a grade failed, in its order.
func (g gradeOut) failing() []string {
	out := []string{}
	for _, c := range g.Checks {
		if c.Result == "fail" {
			out = append(out, c.ID)
		}
	}
	return out
}

// check is the grade's check of this id.
func (g gradeOut) check(id string) checkOut {
	for _, c := range g.Checks {
		if c.ID == id {
			return c
		}
	}
	return checkOut{}
}

var examIDPattern = regexp.MustCompile(`^exm_[a-z2-7]{20}$`)

// startAttempt posts body to POST /v1/test_helpers/exams with key, and returns the reply and,
// for a 201, the attempt.
func (e *env) startAttempt(t testing.TB, key, body, idem string, headerPairs ...string) (reply, examStartedOut) {
	t.Helper()
	headers := append([]string{"Content-Type", "application/json", "Idempotency-Key", idem}, headerPairs...)
	rep := e.do(t, newBodyRequest(http.MethodPost, "/v1/test_helpers/exams", key, body, headers...))
	var out examStartedOut
	if rep.status == http.StatusCreated {
		mustDecodeExact(t, rep.body, &out)
	}
	return rep, out
}

// gradeOf reads the attempt's grade with key.
func (e *env) gradeOf(t testing.TB, id, key string) gradeOut {
	t.Helper()
	rep := e.get(t, "/v1/test_helpers/exams/"+id, key)
	if rep.status != 200 {
		t.Fatalf("the grade = %s", rep)
	}
	var g gradeOut
	mustDecodeExact(t, rep.body, &g)
	return g
}

// examTaker is a client taking an attempt in a test, in an env of its own whose wall clock
// stands between the client's moves: sleep moves it, so a 12 s attempt takes no time and
// every instant a request is judged at is the test's. The attempt's clock starts at the
// client's first request, which it makes at its start (at 0).
type examTaker struct {
	e          *env
	x          examStartedOut
	maker      string
	lastAnswer string        // the body of its last answer
	at         time.Duration // the attempt's clock, since its start
	seq        int           // Idempotency-Keys made
}

// takeExam makes an env (with options o) and an attempt of body in it, made with
// sk_test_sandbox_all.
func takeExam(t testing.TB, o envOptions, body string) *examTaker {
	t.Helper()
	if !strings.Contains(body, `"variant"`) { // the world the tests name: variant 0
		body = strings.Replace(body, "{", `{"variant":0,`, 1)
	}
	o.step, o.quiet = -1, true
	return attemptIn(t, newEnv(t, o), body, "exam-1")
}

// attemptIn makes an attempt of body in the env e, made with sk_test_sandbox_all under the
// Idempotency-Key idem.
func attemptIn(t testing.TB, e *env, body, idem string) *examTaker {
	t.Helper()
	rep, x := e.startAttempt(t, "sk_test_sandbox_all", body, idem)
	if rep.status != 201 {
		t.Fatalf("the attempt = %s", rep)
	}
	return &examTaker{e: e, x: x, maker: "sk_test_sandbox_all"}
}

// sleep waits d on the exam's own time, scale 1: d times the attempt's scale on its clock,
// so that a client written for scale 1 takes any scale.
func (c *examTaker) sleep(d time.Duration) {
	c.e.clock.advance(d * time.Duration(max(1, c.x.Scale)))
	c.at += d
}

// wait waits d on the clock itself, whatever the scale: a Retry-After.
func (c *examTaker) wait(d time.Duration) {
	c.e.clock.advance(d)
	c.at += d / time.Duration(max(1, c.x.Scale))
}

// until sleeps until the attempt's clock shows d after its start.
func (c *examTaker) until(d time.Duration) {
	if d > c.at {
		c.sleep(d - c.at)
	}
}

func (c *examTaker) get(t testing.TB, target string) reply {
	t.Helper()
	return c.e.get(t, target, c.x.Key)
}

func (c *examTaker) post(t testing.TB, target, body, idem string) reply {
	t.Helper()
	return c.e.do(t, newBodyRequest(http.MethodPost, target, c.x.Key, body, "Content-Type", "application/json", "Idempotency-Key", idem))
}

// newKey is an Idempotency-Key of its own.
func (c *examTaker) newKey() string {
	c.seq++
	return fmt.Sprint("k-", c.seq)
}

// orders reads every page of the orders (query added to each), waiting a 429's Retry-After
// (or, when impatient, pause) before sending it again; the orders by id, in the list's order.
func (c *examTaker) orders(t testing.TB, query string, pause time.Duration) []orderJSON {
	t.Helper()
	var all []orderJSON
	join := func(q string) string {
		if q == "" {
			return "/v1/orders"
		}
		return "/v1/orders?" + strings.TrimPrefix(q, "&")
	}
	target := join(query)
	for {
		rep := c.get(t, target)
		if rep.status == 429 {
			if pause > 0 { // impatient, on the clock itself whatever the scale
				c.wait(pause)
				continue
			}
			s, _ := strconv.Atoi(rep.header.Get("Retry-After"))
			c.wait(time.Duration(s) * time.Second)
			continue
		}
		p := decodePage(t, rep)
		all = append(all, p.Data...)
		if p.Pagination.NextCursor == nil {
			return all
		}
		target = join(query + "&cursor=" + url.QueryEscape(*p.Pagination.NextCursor))
	}
}

// answer posts the answer with the attempt's key.
func (c *examTaker) answer(t testing.TB, body string) reply {
	t.Helper()
	c.lastAnswer = body
	return c.post(t, "/v1/test_helpers/exams/"+c.x.ID+"/answer", body, c.newKey())
}

// answerOrders answers the orders held, in the order of their ids.
func (c *examTaker) answerOrders(t testing.TB, held map[string]orderJSON) reply {
	t.Helper()
	type item struct {
		ID         string  `json:"id"`
		Status     string  `json:"status"`
		ShipmentID *string `json:"shipment_id"`
	}
	items := []item{}
	for _, id := range slices.Sorted(maps.Keys(held)) {
		items = append(items, item{id, held[id].Status, held[id].ShipmentID})
	}
	b, _ := json.Marshal(map[string]any{"orders": items})
	return c.answer(t, string(b))
}

// grade is the attempt's grade once computed: read with the maker's key, after the
// client's answer, or past the last instant an answer is taken.
func (c *examTaker) grade(t testing.TB) gradeOut {
	t.Helper()
	g := c.e.gradeOf(t, c.x.ID, c.maker)
	if g.State != "graded" {
		c.e.clock.advance(examClockWait + 80*time.Second*time.Duration(c.x.Scale))
		g = c.e.gradeOf(t, c.x.ID, c.maker)
	}
	if g.State != "graded" || g.Passed == nil || *g.Passed != (len(g.failing()) == 0) {
		t.Fatalf("the grade: %+v", g)
	}
	return g
}

// An examScript takes an attempt: it is a client under test, right or fallen into a trap.
type examScript func(t *testing.T, c *examTaker)

// writeOne books a shipment for the first order held (by id) that takes one, whatever the
// variant (ord_exam_0003 in variant 0's world): a write a read-only client must not do.
func writeOne(t *testing.T, c *examTaker, held map[string]orderJSON) {
	for _, id := range slices.Sorted(maps.Keys(held)) {
		if held[id].ShipmentID != nil {
			continue
		}
		if rep := c.post(t, "/v1/test_helpers/shipments", fmt.Sprintf(`{"reference":"W-1","order_id":%q}`, id), c.newKey()); rep.status == 201 {
			return
		}
	}
	t.Fatalf("no order held takes a shipment: %v", slices.Sorted(maps.Keys(held)))
}

// syncOrders is order-sync's reference client: it reads the whole list every second from the
// start until the deadline, keeps each order as last seen, and answers with the copy.
func syncOrders(every time.Duration, from, to time.Duration, write bool) examScript {
	return func(t *testing.T, c *examTaker) {
		held := map[string]orderJSON{}
		c.until(from)
		for c.at <= to {
			for _, o := range c.orders(t, "", 0) {
				held[o.ID] = o
			}
			if write && c.at == 0 {
				writeOne(t, c, held)
			}
			c.sleep(every)
		}
		c.until(12 * time.Second)
		if rep := c.answerOrders(t, held); rep.status != 200 {
			t.Fatalf("the answer = %s", rep)
		}
	}
}

// writesUnconfirmed is order-sync's reference client that also books an order once, with
// Prefer: code=502 (the write done, answered 502) and never again: a write all the same.
func writesUnconfirmed(t *testing.T, c *examTaker) {
	rep := c.e.do(t, newBodyRequest(http.MethodPost, "/v1/test_helpers/shipments", c.x.Key, `{"reference":"W-502","order_id":"ord_exam_0003"}`, "Content-Type", "application/json", "Idempotency-Key", c.newKey(), "Prefer", "code=502"))
	if rep.status != 502 {
		t.Fatalf("the write = %s", rep)
	}
	syncOrders(time.Second, 0, 12*time.Second, false)(t, c)
}

// watermarkSync is a sync that keeps a created_from watermark: after its first read it asks
// only for orders created at or after the newest it has seen.
func watermarkSync(t *testing.T, c *examTaker) {
	held := map[string]orderJSON{}
	newest := "" // the newest created_at seen: the next read's created_from
	for c.at <= 12*time.Second {
		query := ""
		if newest != "" {
			query = "created_from=" + url.QueryEscape(newest)
		}
		for _, o := range c.orders(t, query, 0) {
			held[o.ID] = o
			newest = max(newest, o.CreatedAt)
		}
		c.sleep(time.Second)
	}
	c.answerOrders(t, held)
}

// TestExamOrderSync: order-sync's reference client passes; a client that does nothing, and
// one for each of its traps, fails exactly the checks named, each a check a person can act
// on, citing the requests that show it.
func TestExamOrderSync(t *testing.T) {
	t.Parallel()
	tight := func(t *testing.T, c *examTaker) { // polls every 100 ms of the clock, whatever the scale, and sends a 429 again 10 ms later
		held := map[string]orderJSON{}
		for c.at <= 12*time.Second {
			for _, o := range c.orders(t, "", 10*time.Millisecond) {
				held[o.ID] = o
			}
			c.wait(100 * time.Millisecond)
		}
		c.answerOrders(t, held)
	}
	examTraps(t, `{"exam":"order-sync"}`, []examTrap{
		{"the reference client", syncOrders(time.Second, 0, 12*time.Second, false), []string{}},
		{"a client that does nothing", nil, []string{"answer.orders", "answer.statuses", "answer.links", "journal.kept_current"}},
		{"a created_from watermark", watermarkSync, []string{"answer.orders", "answer.statuses", "answer.links", "journal.kept_current", "findings.missed_import", "findings.stale_order"}},
		{"one that stops polling early", syncOrders(time.Second, 0, 2*time.Second, false), []string{"answer.orders", "answer.statuses", "answer.links", "journal.kept_current"}},
		{"one that reads only at the end", syncOrders(time.Second, 12*time.Second, 12*time.Second, false), []string{"journal.kept_current"}},
		{"a tight loop that ignores Retry-After", tight, []string{"findings.retry_too_soon"}},
		{"one that writes", syncOrders(time.Second, 0, 12*time.Second, true), []string{"journal.read_only"}},
		{"one that writes, answered 502 (done)", writesUnconfirmed, []string{"journal.read_only"}},
	})
}

// trackConsignments is tracking's reference client: from its start until to, every second,
// it reads each consignment given by its shipment id (or, byNumber, by the tracking number
// given), and answers each one's status as last read.
func trackConsignments(from, to time.Duration, byNumber bool) examScript {
	return func(t *testing.T, c *examTaker) {
		var given struct {
			Consignments []struct {
				ShipmentID     string `json:"shipment_id"`
				TrackingNumber string `json:"tracking_number"`
			} `json:"consignments"`
		}
		mustDecode(t, c.x.Given, &given)
		status := map[string]string{}
		c.until(from)
		for c.at <= to {
			for _, g := range given.Consignments {
				target := "/v1/shipments/" + g.ShipmentID + "/tracking"
				if byNumber {
					target = "/v1/tracking/" + g.TrackingNumber
				}
				rep := c.get(t, target)
				var v struct {
					ShipmentID string `json:"shipment_id"`
					Status     string `json:"status"`
				}
				if rep.status == 200 && json.Unmarshal(rep.body, &v) == nil && v.ShipmentID == g.ShipmentID {
					status[g.ShipmentID] = v.Status
				}
			}
			c.sleep(time.Second)
		}
		c.until(12 * time.Second)
		type item struct {
			ShipmentID string `json:"shipment_id"`
			Status     string `json:"status"`
		}
		items := []item{}
		for _, g := range given.Consignments {
			if s, ok := status[g.ShipmentID]; ok {
				items = append(items, item{g.ShipmentID, s})
			}
		}
		b, _ := json.Marshal(map[string]any{"consignments": items})
		if rep := c.answer(t, string(b)); rep.status != 200 {
			t.Fatalf("the answer = %s", rep)
		}
	}
}

// bookOrders is booking's reference client: from its start until to, every second, it reads
// the orders and books each one it sees (every one, or only those fulfilled without a
// shipment), once; a 502 it sends again as retry says.
func bookOrders(from, to time.Duration, every bool, retry retryPolicy) examScript {
	return func(t *testing.T, c *examTaker) {
		booked := map[string]bool{}
		c.orders(t, "", 0) // the client starts: the attempt's clock runs
		if retry == spendsTheScript {
			for i := range 4 { // shipments for no order, as revision 1's script counted them
				c.post(t, "/v1/test_helpers/shipments", fmt.Sprintf(`{"reference":"SPARE-%d"}`, i), c.newKey())
				c.sleep(250 * time.Millisecond)
			}
		}
		c.until(from)
		for c.at <= to {
			for _, o := range c.orders(t, "", 0) {
				if booked[o.ID] || o.ShipmentID != nil || !every && o.Status != "fulfilled" {
					continue
				}
				body, idem := fmt.Sprintf(`{"reference":"SHIP-%s","order_id":%q}`, o.MerchantReference, o.ID), c.newKey()
				rep := c.post(t, "/v1/test_helpers/shipments", body, idem)
				booked[o.ID] = true
				switch {
				case rep.status != 502:
				case retry == sameKey: // right: the first write's result, or the booking if it was not done
					rep = c.post(t, "/v1/test_helpers/shipments", body, idem)
					booked[o.ID] = rep.status == 201
				case retry == newKey: // blind: another key, a fresh reference, no read of the order
					c.post(t, "/v1/test_helpers/shipments", fmt.Sprintf(`{"reference":"SHIP-%s-again","order_id":%q}`, o.MerchantReference, o.ID), c.newKey())
				}
				c.sleep(250 * time.Millisecond) // within the attempt's 10 requests a second
			}
			c.sleep(time.Second)
		}
	}
}

// retryPolicy is what a booking client does with a 502.
type retryPolicy int

const (
	sameKey         retryPolicy = iota // sends it again with the same Idempotency-Key and body: right
	newKey                             // books again under another key with a fresh reference, reading nothing
	neverRetries                       // takes the 502 as the last word
	spendsTheScript                    // makes four shipments for no order first, then never retries
)

// bookNames is a booking client that reads nothing: it books variant 0's ids at variant 0's
// instants (b1 and b2 at once, b3 at +4.3 s, b7 at +6.3 s), retrying each 502 with the same
// Idempotency-Key. Revision 1's world, the same at every attempt, passed it.
func bookNames(t *testing.T, c *examTaker) {
	book := func(id string) {
		body, idem := fmt.Sprintf(`{"reference":"NAMES-%s","order_id":%q}`, id, id), c.newKey()
		if rep := c.post(t, "/v1/test_helpers/shipments", body, idem); rep.status == 502 {
			c.post(t, "/v1/test_helpers/shipments", body, idem)
		}
	}
	book("ord_exam_b1")
	book("ord_exam_b2")
	c.until(4300 * time.Millisecond)
	book("ord_exam_b3")
	c.until(6300 * time.Millisecond)
	book("ord_exam_b7")
}

// TestExamTracking: tracking's reference client passes; a client that does nothing, one that
// reads by number and one that reads only at the end fail exactly the checks named.
func TestExamTracking(t *testing.T) {
	t.Parallel()
	examTraps(t, `{"exam":"tracking"}`, []examTrap{
		{"the reference client", trackConsignments(0, 12*time.Second, false), []string{}},
		{"a client that does nothing", nil, []string{"answer.consignments", "answer.statuses", "journal.kept_current"}},
		{"one that reads by number", trackConsignments(0, 12*time.Second, true), []string{"answer.consignments", "journal.kept_current", "findings.ambiguous_number", "findings.parcel_number_lookup"}},
		{"one that reads only at the end", trackConsignments(12*time.Second, 12*time.Second, false), []string{"journal.kept_current"}},
	})
}

// TestExamBooking: booking's reference client passes; a client that does nothing, a blind
// retrier, one that books every order, one that books once at the start and one that books
// late fail exactly the checks named.
func TestExamBooking(t *testing.T) {
	t.Parallel()
	examTraps(t, `{"exam":"booking"}`, []examTrap{
		{"the reference client", bookOrders(0, 12*time.Second, false, sameKey), []string{}},
		{"a client that does nothing", nil, []string{"state.booked"}},
		{"a blind retrier after a 502, a fresh reference under a new key", bookOrders(0, 12*time.Second, false, newKey), []string{"findings.blind_retry"}},
		{"one that never retries a 502", bookOrders(0, 12*time.Second, false, neverRetries), []string{"state.booked"}},
		{"one that spends the script on shipments for no order", bookOrders(0, 12*time.Second, false, spendsTheScript), []string{"state.booked"}},
		{"one that books every order it sees", bookOrders(0, 12*time.Second, true, sameKey), []string{"state.only_fulfilled"}},
		{"one that books once at the start", bookOrders(0, 0, false, sameKey), []string{"state.booked"}},
		{"one that books late", bookOrders(10*time.Second, 12*time.Second, false, sameKey), []string{"state.in_time"}},
		{"one that reads nothing and books variant 0's names", bookNames, []string{}},
	})
}

// drawnVariants are n variants drawn for a test, the same at every run.
func drawnVariants(n int, seed uint64) []int64 {
	r := rand.New(rand.NewPCG(seed, 57))
	out := make([]int64, n)
	for i := range out {
		out[i] = 1 + r.Int64N(math.MaxInt32)
	}
	return out
}

// TestExamVariants: a world drawn for each attempt. The reference clients pass every variant
// they are given (20 drawn per exam); the script that books variant 0's names without
// reading fails booking on a drawn variant (it passes variant 0: the world stops it); a
// replay of a passing attempt's requests at the same offsets fails on another variant; two
// attempts of one variant meet the same names and instants, and two variants share no drawn
// name.
func TestExamVariants(t *testing.T) {
	t.Parallel()
	references := map[string]examScript{"order-sync": syncOrders(time.Second, 0, 12*time.Second, false), "tracking": trackConsignments(0, 12*time.Second, false), "booking": bookOrders(0, 12*time.Second, false, sameKey)}
	for exam, client := range references {
		for i, v := range drawnVariants(20, uint64(len(exam))) {
			t.Run(fmt.Sprintf("%s's reference client, variant %d", exam, v), func(t *testing.T) {
				t.Parallel()
				g := examTrapAt(t, fmt.Sprintf(`{"exam":%q,"variant":%d,"scale":%d}`, exam, v, 1+2*(i%2)), examTrap{client: client, fails: []string{}})
				if g.Variant != v {
					t.Errorf("the grade's variant %d, want %d", g.Variant, v)
				}
				if m := g.check(map[string]string{"booking": "state.in_time"}[exam] + map[bool]string{true: "journal.kept_current"}[exam != "booking"]).MarginMS; m == nil || *m < 0 {
					t.Errorf("a pass's margin: %v", m)
				}
			})
		}
	}
	for _, v := range drawnVariants(5, 99) {
		t.Run(fmt.Sprintf("booking's names without a read, variant %d", v), func(t *testing.T) {
			t.Parallel()
			examTrapAt(t, fmt.Sprintf(`{"exam":"booking","variant":%d}`, v), examTrap{client: bookNames, fails: []string{"state.booked"}})
		})
	}
	t.Run("a replay of a passing attempt fails on another variant", func(t *testing.T) {
		t.Parallel()
		c := takeExam(t, envOptions{}, `{"exam":"order-sync","variant":0}`)
		c.get(t, "/v1/test_helpers/clock")
		syncOrders(time.Second, 0, 12*time.Second, false)(t, c)
		if g := c.grade(t); !*g.Passed {
			t.Fatalf("the attempt replayed did not pass:\n%s", gradeText(g))
		}
		c.wait(time.Second)
		sent := c.e.journalOf(t, c.x.Key, "limit=1000")
		answer := c.lastAnswer
		for _, v := range drawnVariants(3, 7) {
			r := takeExam(t, envOptions{}, fmt.Sprintf(`{"exam":"order-sync","variant":%d}`, v))
			r.get(t, "/v1/test_helpers/clock")
			for _, entry := range sent.Data { // the same requests at the same offsets from the start
				at, _ := time.Parse(time.RFC3339Nano, entry.Clock)
				r.until(at.Sub(testNow))
				r.e.do(t, newRequest(entry.Method, entry.Target, r.x.Key))
			}
			r.until(12 * time.Second)
			r.answer(t, answer)
			if g := r.grade(t); *g.Passed || !slices.Contains(g.failing(), "answer.orders") {
				t.Errorf("variant %d: the replay passed %v:\n%s", v, g.failing(), gradeText(g))
			}
		}
	})
	t.Run("one variant, one world; two variants, no name shared", func(t *testing.T) {
		t.Parallel()
		worldOf := func(exam string, v int64) (names []string, seen string) {
			c := takeExam(t, envOptions{}, fmt.Sprintf(`{"exam":%q,"variant":%d}`, exam, v))
			c.get(t, "/v1/test_helpers/clock")
			var timeline strings.Builder
			for _, at := range []string{"start", "start+5s", "start+12s"} { // what the world schedules, around each instant
				c.until(map[string]time.Duration{"start": 0, "start+5s": 5 * time.Second, "start+12s": 12 * time.Second}[at])
				rep := c.get(t, "/v1/test_helpers/timeline")
				timeline.Write(rep.body)
			}
			for _, m := range regexp.MustCompile(`(ord|shp)_exam_[a-z0-9]+|EX[MTB]\d{10}`).FindAllString(timeline.String()+string(c.x.Given), -1) {
				if !slices.Contains(names, m) {
					names = append(names, m)
				}
			}
			for _, o := range c.orders(t, "", 0) {
				if !slices.Contains(names, o.ID) {
					names = append(names, o.ID)
				}
				seen += o.ID + " " + o.Platform + " " + o.CreatedAt + "\n"
			}
			return names, timeline.String() + string(c.x.Given) + seen
		}
		for _, exam := range []string{"order-sync", "tracking", "booking"} {
			a, aSeen := worldOf(exam, 42)
			b, bSeen := worldOf(exam, 42)
			if aSeen != bSeen || !slices.Equal(a, b) {
				t.Errorf("%s: two attempts of variant 42 differ:\n%s\n%s", exam, aSeen, bSeen)
			}
			other, _ := worldOf(exam, 43)
			zero, _ := worldOf(exam, 0)
			for _, name := range a {
				if slices.Contains(other, name) || slices.Contains(zero, name) {
					t.Errorf("%s: %s is in variants 42 and 43 (or 0)", exam, name)
				}
			}
			if len(a) < 5 {
				t.Errorf("%s: the names seen %v", exam, a)
			}
		}
	})
}

// TestExamWorldsDrawn: what a variant draws, over many variants, holds the contract's rules:
// every order and shipment renamed (ord_exam_ and 8 characters, shp_exam_ and 8, numbers of
// their prefix and 10 digits), all distinct and none of variant 0's, two shipments sharing a
// number still sharing one and the given parcel still a further parcel's; every instant after
// the start moved by at most a second and within +1 s to +10 s, in each order's and each
// shipment's order, every instant before it within 5 minutes and still before it; order-sync's
// old orders 21 to 27; booking's two unconfirmed bookings two of its first four.
func TestExamWorldsDrawn(t *testing.T) {
	t.Parallel()
	orderID, shipmentID, number := regexp.MustCompile(`^ord_exam_[a-z0-9]{8}$`), regexp.MustCompile(`^shp_exam_[a-z0-9]{8}$`), regexp.MustCompile(`^EX[MTB]\d{10}$`)
	moved := func(t *testing.T, what string, was, now time.Duration) {
		switch {
		case was > 0 && (now < time.Second || now > 10*time.Second || now-was > time.Second || was-now > time.Second || now%time.Second != 0):
			t.Errorf("%s: %v moved to %v", what, was, now)
		case was <= 0 && (now >= 0 || now-was > 5*time.Minute || was-now > 5*time.Minute || (now-was)%time.Minute != 0):
			t.Errorf("%s: %v moved to %v", what, was, now)
		}
	}
	for _, e := range examCatalogue {
		if !reflect.DeepEqual(e.worldOf(0), e.world.clone()) {
			t.Errorf("%s: variant 0 is not the world as written", e.name)
		}
		for _, v := range drawnVariants(300, 5) {
			w := e.worldOf(v)
			if !reflect.DeepEqual(w, e.worldOf(v)) {
				t.Fatalf("%s variant %d: drawn twice, two worlds", e.name, v)
			}
			names := map[string]bool{}
			distinct := func(name string, pattern *regexp.Regexp) {
				if !pattern.MatchString(name) || names[name] {
					t.Errorf("%s variant %d: %q drawn twice, or not of its form", e.name, v, name)
				}
				names[name] = true
			}
			for i, o := range w.orders {
				distinct(o.id, orderID)
				if !strings.HasPrefix(o.reference, prefixOf(e.world.orders[min(i, len(e.world.orders)-1)].reference)) || !slices.Contains(platforms, o.platform) {
					t.Errorf("%s variant %d: order %+v", e.name, v, o)
				}
				if i < len(e.world.orders) {
					was := e.world.orders[i]
					moved(t, o.id+" created", was.created, o.created)
					for k, ch := range o.changes {
						moved(t, o.id+" change", was.changes[k].at, ch.at)
						if ch.at <= o.created || k > 0 && ch.at <= o.changes[k-1].at {
							t.Errorf("%s variant %d: %s's changes out of order: %+v", e.name, v, o.id, o)
						}
					}
					if o.imported != nil && (*o.imported < o.created) {
						t.Errorf("%s variant %d: %s imported before its creation", e.name, v, o.id)
					}
				}
			}
			shared := map[string]int{}
			for i, sh := range w.shipments {
				distinct(sh.id, shipmentID)
				was := e.world.shipments[i]
				shared[sh.number]++
				if !number.MatchString(sh.number) || sh.number[:3] != was.number[:3] || !strings.HasPrefix(sh.reference, prefixOf(was.reference)) || (sh.orderID == "") != (was.orderID == "") {
					t.Errorf("%s variant %d: shipment %+v", e.name, v, sh)
				}
				for _, p := range sh.parcels {
					distinct(p, number)
				}
				for k, ev := range sh.events {
					moved(t, sh.id+" event", was.events[k].after, ev.after)
					if sh.created != nil && ev.after < *sh.created || k > 0 && ev.after <= sh.events[k-1].after {
						t.Errorf("%s variant %d: %s's events out of order: %+v", e.name, v, sh.id, sh)
					}
				}
			}
			if e.name == "tracking" && (shared[w.shipments[1].number] != 2 || w.shipments[1].number != w.shipments[2].number) {
				t.Errorf("tracking variant %d: the shared number is no longer shared", v)
			}
			for _, g := range w.given {
				if g.parcel >= len(w.shipments[g.shipment].parcels) {
					t.Errorf("%s variant %d: a given parcel that is none", e.name, v)
				}
			}
			if n := len(w.orders) - 6; e.name == "order-sync" && (n < 21 || n > 27) {
				t.Errorf("order-sync variant %d: %d old orders", v, n)
			}
			if u := w.unconfirmed; e.name == "booking" && (u[0] < 1 || u[0] > 4 || u[1] < 1 || u[1] > 4 || u[0] == u[1]) {
				t.Errorf("booking variant %d: unconfirmed %v", v, u)
			}
		}
	}
}

// TestExamMargins: each check's margin_ms, the window less the longest delay it judged: a
// sync that reads every 2 s is 1 s late at worst (2,000 ms left of 3,000; 6,000 of 9,000 at
// scale 3), one that reads every 5 s 1 s too late (-1,000, failed), one that reads nothing
// has none (null); every other check has none; booking's state.in_time says how soon the
// reference client booked.
func TestExamMargins(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		body   string
		client examScript
		check  string
		margin *int64
	}{
		{"reads every 2 s", `{"exam":"order-sync"}`, syncOrders(2*time.Second, 0, 12*time.Second, false), "journal.kept_current", ptrTo[int64](2000)},
		{"reads every 2 s, scale 3", `{"exam":"order-sync","scale":3}`, syncOrders(2*time.Second, 0, 12*time.Second, false), "journal.kept_current", ptrTo[int64](6000)},
		{"reads every 5 s", `{"exam":"order-sync"}`, syncOrders(5*time.Second, 0, 12*time.Second, false), "journal.kept_current", ptrTo[int64](-1000)},
		{"reads nothing", `{"exam":"tracking"}`, nil, "journal.kept_current", nil},
		{"books at once", `{"exam":"booking"}`, bookOrders(0, 12*time.Second, false, sameKey), "state.in_time", ptrTo[int64](2250)}, // its longest: 750 ms, an order ready while it booked another
		{"books at once, scale 3", `{"exam":"booking","scale":3}`, bookOrders(0, 12*time.Second, false, sameKey), "state.in_time", ptrTo[int64](6750)},
		{"reads only at the grading instant", `{"exam":"order-sync"}`, readsAtTheAnswer, "journal.kept_current", nil}, // a read at the answer's own instant is not judged,
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := takeExam(t, envOptions{}, tt.body)
			if tt.client != nil {
				c.get(t, "/v1/test_helpers/clock")
				tt.client(t, c)
			}
			g := c.grade(t)
			for _, ch := range g.Checks {
				switch {
				case ch.ID == tt.check && fmt.Sprint(deref(ch.MarginMS)) != fmt.Sprint(deref(tt.margin)):
					t.Errorf("%s's margin_ms %v, want %v\n%s", ch.ID, deref(ch.MarginMS), deref(tt.margin), gradeText(g))
				case ch.ID != tt.check && ch.MarginMS != nil && ch.ID != "journal.kept_current" && ch.ID != "state.in_time":
					t.Errorf("%s has a margin: %d", ch.ID, *ch.MarginMS)
				}
			}
		})
	}
}

// readsAtTheAnswer reads every order at the deadline and answers at that same instant: the
// grading instant, at which no read is judged.
func readsAtTheAnswer(t *testing.T, c *examTaker) {
	c.until(12 * time.Second)
	held := map[string]orderJSON{}
	for _, o := range c.orders(t, "", 0) {
		held[o.ID] = o
	}
	if rep := c.answerOrders(t, held); rep.status != 200 {
		t.Fatalf("the answer = %s", rep)
	}
}

// ptrTo is a pointer to v.
func ptrTo[T any](v T) *T { return &v }

// deref is *p, or nil for a nil pointer.
func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// TestExamsAreOneTable: the catalogue is the one table of the exams. The document's exam
// names, docs/exams.md's table of exams and its table of checks (each check with the exams
// that hold it), and the README's list are made from it or held to it here, so that a fourth
// exam, or a new check, leaves nothing stale with the suite green.
func TestExamsAreOneTable(t *testing.T) {
	t.Parallel()
	var names []string
	holders := map[string][]string{} // each check: the exams that hold it
	var checks []string
	for _, e := range examCatalogue {
		names = append(names, e.name)
		for _, c := range e.checks {
			if holders[c.id] == nil {
				checks = append(checks, c.id)
			}
			holders[c.id] = append(holders[c.id], e.name)
		}
	}
	var doc map[string]any
	if err := json.Unmarshal(openAPIDocument, &doc); err != nil {
		t.Fatal(err)
	}
	for _, at := range [][]string{{"ExamRequest", "exam"}, {"ExamListing", "name"}} {
		var enum []string
		for _, x := range asSlice(asMap(asMap(asMap(asMap(asMap(doc["components"])["schemas"])[at[0]])["properties"])[at[1]])["enum"]) {
			enum = append(enum, fmt.Sprint(x))
		}
		if !slices.Equal(enum, names) {
			t.Errorf("the document's %s.%s: %v, the catalogue's %v", at[0], at[1], enum, names)
		}
	}
	page, _ := os.ReadFile("docs/exams.md")
	var listed []string
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z-]+)` \\| [A-Z]").FindAllStringSubmatch(string(page), -1) {
		listed = append(listed, m[1])
	}
	if !slices.Equal(listed, names) {
		t.Errorf("docs/exams.md's table of exams: %v, the catalogue's %v", listed, names)
	}
	var rows []string
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z_.]+)` \\| ([a-z, -]+) \\| ").FindAllStringSubmatch(string(page), -1) {
		rows = append(rows, m[1]+": "+m[2])
	}
	var want []string
	for _, id := range checks {
		exams := strings.Join(holders[id], ", ")
		if len(holders[id]) == len(names) {
			exams = "every exam"
		}
		want = append(want, id+": "+exams)
	}
	slices.Sort(rows)
	slices.Sort(want)
	if !slices.Equal(rows, want) {
		t.Errorf("docs/exams.md's table of checks:\n%s\nthe catalogue's:\n%s", strings.Join(rows, "\n"), strings.Join(want, "\n"))
	}
	readme, _ := os.ReadFile("README.md")
	quoted := "(`" + strings.Join(names, "`, `") + "`)"
	if !strings.Contains(string(readme), quoted) {
		t.Errorf("the README does not list the exams as %s", quoted)
	}
}

// TestEveryCheckIsCaughtFailing: every check of every exam is caught failing, each by a
// client of its own that fails exactly that check, taken at scale 1 and at scale 3 (variant
// 0's world, whose names the clients may know); the checks no client can fail alone are
// listed with the reason, and each of them is failed, beside others, by some client. A check
// that no client can fail, or a finding that never fires, passes nothing here.
func TestEveryCheckIsCaughtFailing(t *testing.T) {
	t.Parallel()
	caught := trapClients()
	// Checks no client can fail alone, and a client that fails each beside others.
	alone := map[string]map[string]struct {
		why    string
		client examScript
	}{
		"order-sync": {
			"findings.missed_import":        {"an import missed is a thing not shown: journal.kept_current fails with it", watermarkSync},
			"findings.stale_order":          {"every change of the world is by +6 s: a change not read within 3 s fails journal.kept_current, one read is not stale", watermarkSync},
			"findings.ambiguous_number":     {"its world holds no number two shipments share: two made by the client are writes (journal.read_only)", inTurn(writeOnce(`{"reference":"T-1","tracking_number":"EXMTWIN0001"}`), writeOnce(`{"reference":"T-2","tracking_number":"EXMTWIN0001"}`), lookUp("EXMTWIN0001"), syncTweaked(nil, nil))},
			"findings.blind_retry":          {"a retry is a write (journal.read_only)", inTurn(blindWriter, syncTweaked(nil, nil))},
			"findings.parcel_number_lookup": {"its world holds no further parcel: one made by the client is a write (journal.read_only)", inTurn(writeOnce(`{"reference":"P-1","tracking_number":"EXMPRIMARY1","parcel_tracking_numbers":["EXMPARCEL01"]}`), lookUp("EXMPARCEL01"), syncTweaked(nil, nil))},
		},
		"tracking": {
			"findings.missed_import": {"its world holds no order, and a client cannot make one: no client can fail it (the contract's one check per finding code in every exam alike)", nil},
			"findings.stale_order":   {"its world holds no order, and a client cannot make one: no client can fail it (the contract's one check per finding code in every exam alike)", nil},
			"findings.blind_retry":   {"a retry is a write (journal.read_only)", inTurn(blindWriter, trackTweaked(nil, nil, nil))},
		},
	}
	for _, e := range examCatalogue {
		for _, c := range e.checks {
			_, ok := caught[e.name][c.id]
			_, excused := alone[e.name][c.id]
			if ok == excused {
				t.Errorf("%s's %s: caught by a client of its own %v, listed as failed only beside others %v", e.name, c.id, ok, excused)
			}
		}
	}
	for exam, clients := range caught {
		for check, client := range clients {
			for _, scale := range []int{1, 3} {
				t.Run(fmt.Sprintf("%s %s at scale %d", exam, check, scale), func(t *testing.T) {
					t.Parallel()
					examTrapAt(t, fmt.Sprintf(`{"exam":%q,"scale":%d}`, exam, scale), examTrap{client: client, fails: []string{check}})
				})
			}
		}
	}
	for exam, checks := range alone {
		for check, a := range checks {
			if a.client == nil {
				continue
			}
			t.Run(fmt.Sprintf("%s %s beside others", exam, check), func(t *testing.T) {
				t.Parallel()
				c := takeExam(t, envOptions{}, fmt.Sprintf(`{"exam":%q}`, exam))
				c.get(t, "/v1/test_helpers/clock")
				a.client(t, c)
				if g := c.grade(t); !slices.Contains(g.failing(), check) {
					t.Errorf("%s's %s is never failed: %v", exam, check, g.failing())
				}
			})
		}
	}
}

// trapClients are, for each exam, a client of its own for each check a client can fail alone,
// written for variant 0's world.
func trapClients() map[string]map[string]examScript {
	return map[string]map[string]examScript{
		"order-sync": {
			"answer.orders":   syncTweaked(func(held map[string]orderJSON) { delete(held, "ord_exam_0004") }, nil),
			"answer.statuses": syncTweaked(func(held map[string]orderJSON) { o := held["ord_exam_0004"]; o.Status = "cancelled"; held[o.ID] = o }, nil),
			"answer.links": syncTweaked(func(held map[string]orderJSON) { // the first order held (by id): ord_exam_0001 in variant 0's world
				o := held[slices.Min(slices.Collect(maps.Keys(held)))]
				o.ShipmentID = ptrTo("shp_nowhere")
				held[o.ID] = o
			}, nil),
			"journal.kept_current":    syncOrders(time.Second, 12*time.Second, 12*time.Second, false),
			"findings.retry_too_soon": tightSync,
			"journal.read_only":       syncOrders(time.Second, 0, 12*time.Second, true),
			"journal.complete":        syncTweaked(nil, flood),
		},
		"tracking": {
			"answer.consignments":           trackTweaked(nil, func(items []consignmentItem) []consignmentItem { return items[1:] }, nil),
			"answer.statuses":               trackTweaked(nil, func(items []consignmentItem) []consignmentItem { items[0].Status = "cancelled"; return items }, nil),
			"journal.kept_current":          trackConsignments(12*time.Second, 12*time.Second, false),
			"findings.retry_too_soon":       trackTight,
			"findings.ambiguous_number":     trackTweaked(lookUp("EXT1000000002"), nil, nil),
			"findings.parcel_number_lookup": trackTweaked(lookUp("EXT1000000005"), nil, nil),
			"journal.read_only":             trackTweaked(writeOnce(`{"reference":"W-1"}`), nil, nil),
			"journal.complete":              trackTweaked(nil, nil, flood),
		},
		"booking": {
			"state.booked":                  bookOrders(0, 12*time.Second, false, neverRetries),
			"state.only_fulfilled":          bookOrders(0, 12*time.Second, true, sameKey),
			"state.in_time":                 bookOrders(10*time.Second, 12*time.Second, false, sameKey),
			"findings.retry_too_soon":       bookTight,
			"findings.missed_import":        bookBlindToImports,
			"findings.stale_order":          bookThenLookAway,
			"findings.ambiguous_number":     bookWith(writeOnce(`{"reference":"TWIN","tracking_number":"EXB1000000000"}`), lookUp("EXB1000000000")),
			"findings.blind_retry":          bookOrders(0, 12*time.Second, false, newKey),
			"findings.parcel_number_lookup": bookWith(writeOnce(`{"reference":"PARCELS","tracking_number":"EXBPRIMARY01","parcel_tracking_numbers":["EXBPARCEL001"]}`), lookUp("EXBPARCEL001")),
			"journal.complete":              bookWith(nil, flood),
		},
	}
}

// TestExamTracesRegrade: the trace of every trap client, on 5 variants each, regrades to the
// grade the server computed (the reference clients' do so on 20 variants, in
// TestExamVariants; a flood's, its journal's first 2,000 entries kept and the rest lost, in
// TestEveryCheckIsCaughtFailing).
func TestExamTracesRegrade(t *testing.T) {
	t.Parallel()
	for exam, clients := range trapClients() {
		for check, client := range clients {
			if check == "journal.complete" {
				continue
			}
			t.Run(fmt.Sprintf("%s %s", exam, check), func(t *testing.T) {
				t.Parallel()
				e := newEnv(t, envOptions{step: -1, quiet: true, unchecked: true}) // each answer is checked in the tests of its own
				for i, v := range drawnVariants(5, uint64(len(exam)+len(check))) { // one after another, each on the clock where the last left it
					c := attemptIn(t, e, fmt.Sprintf(`{"exam":%q,"variant":%d}`, exam, v), fmt.Sprint("exam-", i))
					c.get(t, "/v1/test_helpers/clock")
					client(t, c)
					traceRegrades(t, c, c.grade(t))
				}
			})
		}
	}
}

// syncTweaked is order-sync's reference client, whose copy tweak changes (nil: none) and which
// does after before it answers (nil: nothing).
func syncTweaked(tweak func(held map[string]orderJSON), after examScript) examScript {
	return func(t *testing.T, c *examTaker) {
		held := map[string]orderJSON{}
		for c.at <= 12*time.Second {
			for _, o := range c.orders(t, "", 0) {
				held[o.ID] = o
			}
			c.sleep(time.Second)
		}
		if tweak != nil {
			tweak(held)
		}
		if after != nil {
			after(t, c)
		}
		if rep := c.answerOrders(t, held); rep.status != 200 {
			t.Fatalf("the answer = %s", rep)
		}
	}
}

// tightSync polls every 100 ms of the clock, whatever the scale, and sends a 429 again 10 ms
// later, ignoring its Retry-After.
func tightSync(t *testing.T, c *examTaker) {
	held := map[string]orderJSON{}
	for c.at <= 12*time.Second {
		for _, o := range c.orders(t, "", 10*time.Millisecond) {
			held[o.ID] = o
		}
		c.wait(100 * time.Millisecond)
	}
	c.answerOrders(t, held)
}

// flood sends one request more than the attempt's journal keeps, each to a target of its own
// (its 429s each an entry): the journal keeps its first ones and loses the rest.
func flood(t *testing.T, c *examTaker) {
	for i := range c.e.srv.registry.named[c.x.ID].exam.kept + 1 {
		c.get(t, fmt.Sprintf("/v1/orders/ord_flood_%05d", i))
	}
	c.wait(time.Second)
}

// lookUp is a client's one lookup by a tracking number.
func lookUp(number string) examScript {
	return func(t *testing.T, c *examTaker) { c.get(t, "/v1/tracking/"+number) }
}

// writeOnce is a client's one creation of a shipment with body.
func writeOnce(body string) examScript {
	return func(t *testing.T, c *examTaker) {
		if rep := c.post(t, "/v1/test_helpers/shipments", body, c.newKey()); rep.status != 201 {
			t.Fatalf("the write = %s", rep)
		}
	}
}

// blindWriter creates a shipment once answered 502 (done), and sends it again under another
// Idempotency-Key.
func blindWriter(t *testing.T, c *examTaker) {
	body := `{"reference":"W-BLIND"}`
	c.e.do(t, newBodyRequest(http.MethodPost, "/v1/test_helpers/shipments", c.x.Key, body, "Content-Type", "application/json", "Idempotency-Key", c.newKey(), "Prefer", "code=502"))
	c.post(t, "/v1/test_helpers/shipments", body, c.newKey())
}

// inTurn is a client that is each of clients in turn.
func inTurn(clients ...examScript) examScript {
	return func(t *testing.T, c *examTaker) {
		for _, client := range clients {
			client(t, c)
		}
	}
}

// consignmentItem is an item of tracking's answer.
type consignmentItem struct {
	ShipmentID string `json:"shipment_id"`
	Status     string `json:"status"`
}

// trackTweaked is tracking's reference client, which does before first (nil: nothing), whose
// answer tweak changes (nil: none), and which does after before it answers.
func trackTweaked(before examScript, tweak func([]consignmentItem) []consignmentItem, after examScript) examScript {
	return func(t *testing.T, c *examTaker) {
		if before != nil {
			before(t, c)
		}
		items := trackRead(t, c, 0)
		if tweak != nil {
			items = tweak(items)
		}
		if after != nil {
			after(t, c)
		}
		b, _ := json.Marshal(map[string]any{"consignments": items})
		if rep := c.answer(t, string(b)); rep.status != 200 {
			t.Fatalf("the answer = %s", rep)
		}
	}
}

// trackRead reads each consignment given by its shipment id from the start until the
// deadline, every second (pause 0), or every 100 ms of the clock, sending a 429 again pause
// later; and says each one's status as last read.
func trackRead(t *testing.T, c *examTaker, pause time.Duration) []consignmentItem {
	var given struct {
		Consignments []consignmentItem `json:"consignments"`
	}
	mustDecode(t, c.x.Given, &given)
	status := map[string]string{}
	for c.at <= 12*time.Second {
		for _, g := range given.Consignments {
			rep := c.get(t, "/v1/shipments/"+g.ShipmentID+"/tracking")
			for pause > 0 && rep.status == 429 {
				c.wait(pause)
				rep = c.get(t, "/v1/shipments/"+g.ShipmentID+"/tracking")
			}
			var v consignmentItem
			if rep.status == 200 && json.Unmarshal(rep.body, &v) == nil {
				status[g.ShipmentID] = v.Status
			}
		}
		if pause > 0 {
			c.wait(100 * time.Millisecond)
		} else {
			c.sleep(time.Second)
		}
	}
	c.until(12 * time.Second)
	items := []consignmentItem{}
	for _, g := range given.Consignments {
		items = append(items, consignmentItem{g.ShipmentID, status[g.ShipmentID]})
	}
	return items
}

// trackTight reads every 100 ms of the clock, sending a 429 again 10 ms later.
func trackTight(t *testing.T, c *examTaker) {
	b, _ := json.Marshal(map[string]any{"consignments": trackRead(t, c, 10*time.Millisecond)})
	c.answer(t, string(b))
}

// bookWith is booking's reference client, which does before first and after last (nil:
// nothing).
func bookWith(before, after examScript) examScript {
	return func(t *testing.T, c *examTaker) {
		if before != nil {
			before(t, c)
		}
		bookOrders(0, 10*time.Second, false, sameKey)(t, c)
		if after != nil {
			after(t, c)
		}
	}
}

// bookTight is booking's reference client polling every 50 ms of the clock (past its 10
// requests a second) and sending a 429 of a read again 10 ms later (its bookings wait their
// Retry-After).
func bookTight(t *testing.T, c *examTaker) {
	booked := map[string]bool{}
	for c.at <= 12*time.Second {
		for _, o := range c.orders(t, "", 10*time.Millisecond) {
			if booked[o.ID] || o.ShipmentID != nil || o.Status != "fulfilled" {
				continue
			}
			body, idem := fmt.Sprintf(`{"reference":"SHIP-%s","order_id":%q}`, o.MerchantReference, o.ID), c.newKey()
			for {
				rep := c.post(t, "/v1/test_helpers/shipments", body, idem)
				if rep.status == 429 {
					s, _ := strconv.Atoi(rep.header.Get("Retry-After"))
					c.wait(time.Duration(s) * time.Second)
					continue
				}
				if rep.status != 502 {
					break
				}
			}
			booked[o.ID] = true
		}
		c.wait(50 * time.Millisecond)
	}
}

// bookBlindToImports reads the whole list once at the start and then only the orders it saw,
// by id, every second; it books each fulfilled one, and ord_exam_b7, which it never reads,
// by its name once it is imported: the import it missed is a finding, and nothing else.
func bookBlindToImports(t *testing.T, c *examTaker) {
	seen := map[string]orderJSON{}
	for _, o := range c.orders(t, "", 0) {
		seen[o.ID] = o
	}
	booked := map[string]bool{}
	book := func(id, ref string) {
		body, idem := fmt.Sprintf(`{"reference":"SHIP-%s","order_id":%q}`, ref, id), c.newKey()
		if rep := c.post(t, "/v1/test_helpers/shipments", body, idem); rep.status == 502 {
			c.post(t, "/v1/test_helpers/shipments", body, idem)
		}
		booked[id] = true
		c.sleep(250 * time.Millisecond)
	}
	for c.at <= 12*time.Second {
		for _, id := range slices.Sorted(maps.Keys(seen)) {
			var o orderJSON
			strict(t, c.get(t, "/v1/orders/"+id), &o)
			if o.Status == "fulfilled" && o.ShipmentID == nil && !booked[id] {
				book(id, o.MerchantReference)
			}
			c.sleep(100 * time.Millisecond)
		}
		if !booked["ord_exam_b7"] && c.at >= 6500*time.Millisecond {
			book("ord_exam_b7", "BK-7")
		}
		c.sleep(time.Second)
	}
}

// bookThenLookAway books as the reference client until +7 s, then reads one order that never
// changes before the deadline: the order it booked last was last seen without its shipment.
func bookThenLookAway(t *testing.T, c *examTaker) {
	bookOrders(0, 7*time.Second, false, sameKey)(t, c)
	c.until(11 * time.Second) // before the deadline, booking's grading instant
	c.get(t, "/v1/orders/ord_exam_b8")
}

// examTrap is a client of an exam, and the checks it fails.
type examTrap struct {
	name   string
	client examScript // nil: a client that does nothing
	fails  []string
}

// examTraps has each client take an attempt of body of its own, all in parallel, at scale 1
// and at scale 3 (each client's moves on the exam's own time), and holds each grade to the
// checks it names: each failure with a sentence, each pass without.
func examTraps(t *testing.T, body string, traps []examTrap) {
	for _, scale := range []int{1, 3} {
		for _, tt := range traps {
			t.Run(fmt.Sprintf("%s at scale %d", tt.name, scale), func(t *testing.T) {
				t.Parallel()
				examTrapAt(t, strings.Replace(body, "{", fmt.Sprintf(`{"scale":%d,`, scale), 1), tt)
			})
		}
	}
}

// examTrapAt has the trap's client take an attempt of body, and holds its grade to the
// checks the trap names.
func examTrapAt(t *testing.T, body string, tt examTrap) gradeOut {
	t.Helper()
	c := takeExam(t, envOptions{examEntries: 2000}, body) // a journal's bound lowered, so that a flood past it is cheap (its 20,000: TestExamGradeHolds)
	if tt.client != nil {
		c.get(t, "/v1/test_helpers/clock") // the client's first request: the attempt's clock runs from it
		tt.client(t, c)
	}
	g := c.grade(t)
	if got := g.failing(); !slices.Equal(got, tt.fails) {
		t.Errorf("variant %d, scale %d: failed %v, want %v\n%s", g.Variant, g.Scale, got, tt.fails, gradeText(g))
	}
	for _, ch := range g.Checks {
		if (ch.Result == "fail") != (ch.Detail != nil) || ch.Detail != nil && !strings.HasSuffix(*ch.Detail, ".") {
			t.Errorf("%s: %s, detail %v", ch.ID, ch.Result, ch.Detail)
		}
	}
	traceRegrades(t, c, g)
	return g
}

// traceRegrades reads the graded attempt's trace with the key that made it and judges it
// again as exam regrade does: the grade found is the one the trace records, which is the
// one GET reads. It returns the trace.
func traceRegrades(t testing.TB, c *examTaker, g gradeOut) []byte {
	t.Helper()
	rep := c.e.get(t, "/v1/test_helpers/exams/"+c.x.ID+"/trace", c.maker)
	if rep.status != 200 || rep.header.Get("Content-Type") != "application/json" || rep.header.Get("Content-Disposition") != `attachment; filename="`+c.x.ID+`.har"` {
		t.Fatalf("the trace: %d %v", rep.status, rep.header)
	}
	recorded, found, err := regrade(rep.body, -1)
	if err != nil {
		t.Fatalf("regrade: %v", err)
	}
	if diffs := gradeDiffers(recorded, found, false); len(diffs) > 0 {
		t.Errorf("variant %d, scale %d: the trace regrades otherwise:\n%s", g.Variant, g.Scale, strings.Join(diffs, "\n"))
	}
	got, _ := json.Marshal(recorded.Checks)
	var want []examCheckOut
	for _, ch := range g.Checks {
		want = append(want, examCheckOut{ID: ch.ID, Result: ch.Result, Detail: ch.Detail, Requests: ch.Requests, MarginMS: ch.MarginMS})
	}
	if w, _ := json.Marshal(want); string(got) != string(w) || *recorded.Passed != *g.Passed || *recorded.Score != *g.Score {
		t.Errorf("the trace records another grade than GET's:\n%s\n%s", got, w)
	}
	if bytes.Contains(rep.body, []byte(c.x.Key)) {
		t.Errorf("the trace holds the attempt's key unmasked")
	}
	return rep.body
}

// TestExamRoutes: the catalogue, an attempt's start, its answer and its grade, each with its
// checks in their order and its errors.
func TestExamRoutes(t *testing.T) {
	t.Parallel()
	t.Run("the catalogue", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, envOptions{quiet: true})
		for _, key := range []string{"sk_test_sandbox_all", "sk_test_sandbox_none", "sk_test_other_all"} {
			rep := e.get(t, "/v1/test_helpers/exams", key)
			var out struct {
				Data []struct {
					Name            string          `json:"name"`
					Revision        int             `json:"revision"`
					Title           string          `json:"title"`
					Task            string          `json:"task"`
					DurationSeconds int             `json:"duration_seconds"`
					Answer          bool            `json:"answer"`
					Given           json.RawMessage `json:"given"`
					Checks          []struct {
						ID    string `json:"id"`
						Title string `json:"title"`
					} `json:"checks"`
				} `json:"data"`
			}
			dec := json.NewDecoder(bytes.NewReader(rep.body))
			dec.DisallowUnknownFields()
			if rep.status != 200 || dec.Decode(&out) != nil || len(out.Data) != 3 {
				t.Fatalf("%s: %s", key, rep)
			}
			var names []string
			for _, x := range out.Data {
				names = append(names, x.Name)
				var ids []string
				for _, c := range x.Checks {
					ids = append(ids, c.ID)
				}
				want := map[string]string{
					"order-sync": "answer.orders answer.statuses answer.links journal.kept_current findings.retry_too_soon findings.missed_import findings.stale_order findings.ambiguous_number findings.blind_retry findings.parcel_number_lookup journal.read_only journal.complete",
					"tracking":   "answer.consignments answer.statuses journal.kept_current findings.retry_too_soon findings.missed_import findings.stale_order findings.ambiguous_number findings.blind_retry findings.parcel_number_lookup journal.read_only journal.complete",
					"booking":    "state.booked state.only_fulfilled state.in_time findings.retry_too_soon findings.missed_import findings.stale_order findings.ambiguous_number findings.blind_retry findings.parcel_number_lookup journal.complete",
				}[x.Name]
				if strings.Join(ids, " ") != want || x.Revision != 2 || x.DurationSeconds != 12 || x.Answer != (x.Name != "booking") || x.Task == "" || x.Title == "" {
					t.Errorf("%s: %+v", x.Name, x)
				}
			}
			if strings.Join(names, " ") != "order-sync tracking booking" {
				t.Errorf("the catalogue's order: %v", names)
			}
		}
		wantProblem(t, e.get(t, "/v1/test_helpers/exams", "sk_live_sandbox_all"), 503, "live_not_released", "")
		wantProblem(t, e.get(t, "/v1/test_helpers/exams", "sk_test_sandbox_revoked"), 401, "revoked_api_key", "")
		wantProblem(t, e.get(t, "/v1/test_helpers/exams?limit=1", "sk_test_sandbox_all"), 422, "unknown_parameter", "limit")
		if rep := e.get(t, "/v1/test_helpers/exams", "sk_test_sandbox_all", "Prefer", "code=503"); rep.status != 503 {
			t.Errorf("Prefer code=503: %s", rep)
		}
	})
	t.Run("a start's body, member by member", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, envOptions{quiet: true})
		for i, tt := range []struct {
			body        string
			status      int
			code, param string
		}{
			{`{}`, 422, "invalid_parameter", "exam"},
			{`{"exam":"billing"}`, 422, "invalid_parameter", "exam"},
			{`{"exam":1}`, 422, "invalid_parameter", "exam"},
			{`{"exam":"order-sync","revision":1}`, 422, "invalid_parameter", "revision"},
			{`{"exam":"order-sync","variant":-1}`, 422, "invalid_parameter", "variant"},
			{`{"exam":"order-sync","variant":2147483648}`, 422, "invalid_parameter", "variant"},
			{`{"exam":"order-sync","variant":1.5}`, 422, "invalid_parameter", "variant"},
			{`{"exam":"order-sync","variant":1e3}`, 422, "invalid_parameter", "variant"},
			{`{"exam":"order-sync","variant":"7"}`, 422, "invalid_parameter", "variant"},
			{`{"exam":"order-sync","variant":null}`, 422, "invalid_parameter", "variant"},
			{`{"exam":"order-sync","variant":7,"variant":7}`, 422, "invalid_parameter", "variant"},
			{`{"exam":"order-sync","revision":"1"}`, 422, "invalid_parameter", "revision"},
			{`{"exam":"order-sync","scale":0}`, 422, "invalid_parameter", "scale"},
			{`{"exam":"order-sync","scale":61}`, 422, "invalid_parameter", "scale"},
			{`{"exam":"order-sync","scale":1.5}`, 422, "invalid_parameter", "scale"},
			{`{"exam":"order-sync","scale":null}`, 422, "invalid_parameter", "scale"},
			{`{"exam":"order-sync","seed":1}`, 422, "unknown_parameter", "seed"},
			{`{"exam":"order-sync","exam":"tracking"}`, 422, "invalid_parameter", "exam"},
			{`{"exam":"order-sync"`, 400, "malformed_json", ""},
			{`[]`, 400, "malformed_json", ""},
		} {
			rep, _ := e.startAttempt(t, "sk_test_sandbox_all", tt.body, fmt.Sprint("k-", i))
			wantProblem(t, rep, tt.status, tt.code, tt.param)
		}
		rep, _ := e.startAttempt(t, "sk_test_sandbox_all", `{"exam":"order-sync"}`, "")
		wantProblem(t, rep, 400, "invalid_idempotency_key", "Idempotency-Key")
		rep, _ = e.startAttempt(t, "sk_live_sandbox_all", `{"exam":"order-sync"}`, "k")
		wantProblem(t, rep, 503, "live_not_released", "")
		rep, _ = e.startAttempt(t, "sk_test_sandbox_all", `{"exam":"order-sync"}`, "k", "Prefer", "code=418")
		wantProblem(t, rep, 422, "invalid_parameter", "Prefer")
	})
	t.Run("a start", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, envOptions{quiet: true, step: -1})
		rep, x := e.startAttempt(t, "sk_test_sandbox_none", `{"scale":3,"revision":2,"exam":"tracking","variant":0}`, "k-1")
		if rep.status != 201 || rep.header.Get("Location") != "/v1/test_helpers/exams/"+x.ID || !examIDPattern.MatchString(x.ID) || !sandboxAccountPattern.MatchString(x.Account) ||
			!sandboxKeyPattern.MatchString(x.Key) || x.Exam != "tracking" || x.Revision != 2 || x.Variant != 0 || x.Scale != 3 || x.StartedAt != "2026-11-22T12:00:00Z" || x.Deadline != "2026-11-22T12:00:36Z" || !strings.HasPrefix(string(x.Given), `{"consignments":[{"shipment_id":"shp_exam_t1"`) {
			t.Fatalf("%s", rep)
		}
		if !strings.HasPrefix(string(rep.body), `{"id":"exm_`) || !strings.Contains(string(rep.body), `"account":"`+x.Account+`","key":"`) {
			t.Errorf("the members' order: %s", rep.body)
		}
		again, _ := e.startAttempt(t, "sk_test_sandbox_none", `{"scale":3,"revision":2,"exam":"tracking","variant":0}`, "k-1")
		if again.status != 201 || again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, rep.body) {
			t.Errorf("a replay: %s", again)
		}
		reused, _ := e.startAttempt(t, "sk_test_sandbox_none", `{"exam":"tracking"}`, "k-1")
		wantProblem(t, reused, 409, "idempotency_key_reused", "")
		// The attempt's world, every instant times 3: t4 is found by its primary number only
		// (the label given is its second parcel's); t1 is in transit from +6 s, not before.
		if rep := e.get(t, "/v1/tracking/EXT1000000004", x.Key); rep.status != 200 || !strings.Contains(string(rep.body), `"shipment_id":"shp_exam_t4"`) {
			t.Errorf("t4's primary number: %s", rep)
		}
		wantProblem(t, e.get(t, "/v1/tracking/EXT1000000005", x.Key), 404, "not_found", "")
		e.clock.advance(5 * time.Second)
		if rep := e.get(t, "/v1/shipments/shp_exam_t1/tracking", x.Key); !strings.Contains(string(rep.body), `"tracking_number":"EXT1000000001","status":"pre_transit","events":`) {
			t.Errorf("t1 at +5 s, scale 3: %s", rep)
		}
		e.clock.advance(time.Second)
		if rep := e.get(t, "/v1/shipments/shp_exam_t1/tracking", x.Key); !strings.Contains(string(rep.body), `"tracking_number":"EXT1000000001","status":"in_transit","events":`) {
			t.Errorf("t1 at +6 s, scale 3: %s", rep)
		}
		// It sees nothing of the account that made it, and that account nothing of it.
		wantProblem(t, e.get(t, "/v1/orders/ord_sbx_0001", x.Key), 404, "not_found", "")
		wantProblem(t, e.get(t, "/v1/shipments/shp_exam_t1/tracking", "sk_test_sandbox_all"), 404, "not_found", "")
		// Prefer code=502: the attempt made, its 201 stored under the key.
		bad, _ := e.startAttempt(t, "sk_test_sandbox_all", `{"exam":"booking"}`, "k-502", "Prefer", "code=502")
		wantProblem(t, bad, 502, "provider_not_confirmed", "")
		if stored, made := e.startAttempt(t, "sk_test_sandbox_all", `{"exam":"booking"}`, "k-502"); stored.status != 201 || stored.header.Get("Idempotent-Replayed") != "true" || e.gradeOf(t, made.ID, "sk_test_sandbox_all").Exam != "booking" {
			t.Errorf("the 502's stored answer: %s", stored)
		}
	})
	t.Run("an answer, its checks in their order", func(t *testing.T) {
		t.Parallel()
		c := takeExam(t, envOptions{}, `{"exam":"order-sync"}`)
		answer := func(key, id, body, idem string) reply {
			return c.e.do(t, newBodyRequest(http.MethodPost, "/v1/test_helpers/exams/"+id+"/answer", key, body, "Content-Type", "application/json", "Idempotency-Key", idem))
		}
		wantProblem(t, answer("", c.x.ID, `{"orders":[]}`, "a"), 401, "missing_api_key", "")
		wantProblem(t, answer(c.x.Key, c.x.ID, `{"orders":[]}`, ""), 400, "invalid_idempotency_key", "Idempotency-Key")
		wantProblem(t, answer(c.maker, c.x.ID, `{"orders":[]}`, "a"), 404, "not_found", "") // the maker's key reads, it does not answer
		wantProblem(t, answer(c.x.Key, "exm_aaaaaaaaaaaaaaaaaaaa", `{"orders":[]}`, "a"), 404, "not_found", "")
		for i, tt := range []struct {
			body        string
			status      int
			code, param string
		}{
			{`{"orders":`, 400, "malformed_json", ""},
			{`{}`, 422, "invalid_parameter", "orders"},
			{`{"consignments":[]}`, 422, "unknown_parameter", "consignments"},
			{`{"orders":[],"orders":[]}`, 422, "invalid_parameter", "orders"},
			{`{"orders":{}}`, 422, "invalid_parameter", "orders"},
			{`{"orders":[1]}`, 422, "invalid_parameter", "orders[0]"},
			{`{"orders":[{"id":"ord_exam_0001","status":"fulfilled"}]}`, 422, "invalid_parameter", "orders[0].shipment_id"},
			{`{"orders":[{"id":"ord_exam_0001","status":"shipped","shipment_id":null}]}`, 422, "invalid_parameter", "orders[0].status"},
			{`{"orders":[{"id":"ord_exam_0001","status":"fulfilled","shipment_id":null,"note":"x"}]}`, 422, "unknown_parameter", "orders[0].note"},
			{`{"orders":[{"id":null,"status":"fulfilled","shipment_id":null}]}`, 422, "invalid_parameter", "orders[0].id"},
		} {
			wantProblem(t, answer(c.x.Key, c.x.ID, tt.body, fmt.Sprint("a-", i)), tt.status, tt.code, tt.param)
		}
		// Before the deadline: 409 with the seconds until it, rounded up; the attempt's clock
		// stands until its key's first request to a route other than the exam routes.
		rep := answer(c.x.Key, c.x.ID, `{"orders":[{"id":"ord_nowhere","status":"fulfilled","shipment_id":null}]}`, "a-1")
		wantProblem(t, rep, 409, "exam_running", "")
		if rep.header.Get("Retry-After") != "12" {
			t.Errorf("Retry-After %q, want 12: the clock stands at the start", rep.header.Get("Retry-After"))
		}
		c.get(t, "/v1/orders?limit=1")
		c.sleep(11500 * time.Millisecond)
		if rep := answer(c.x.Key, c.x.ID, `{"orders":[]}`, "a-2"); rep.header.Get("Retry-After") != "1" {
			t.Errorf("0.5 s before the deadline: %s, Retry-After %q", rep, rep.header.Get("Retry-After"))
		}
		c.sleep(500 * time.Millisecond)
		// An id the world does not hold, and one given twice, are graded, not refused.
		graded := answer(c.x.Key, c.x.ID, `{"orders":[{"id":"ord_nowhere","status":"fulfilled","shipment_id":null},{"id":"ord_exam_0003","status":"unfulfilled","shipment_id":null},{"id":"ord_exam_0003","status":"unfulfilled","shipment_id":null}]}`, "a-3")
		if graded.status != 200 || !strings.Contains(string(graded.body), `"state":"graded"`) || !strings.Contains(string(graded.body), "holds 1 that it should not (ord_nowhere), holds 1 more than once (ord_exam_0003)") {
			t.Fatalf("the answer: %s", graded)
		}
		if again := answer(c.x.Key, c.x.ID, `{"orders":[{"id":"ord_nowhere","status":"fulfilled","shipment_id":null},{"id":"ord_exam_0003","status":"unfulfilled","shipment_id":null},{"id":"ord_exam_0003","status":"unfulfilled","shipment_id":null}]}`, "a-3"); again.status != 200 || again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, graded.body) {
			t.Errorf("a replay: %s", again)
		}
		wantProblem(t, answer(c.x.Key, c.x.ID, `{"orders":[]}`, "a-4"), 409, "exam_graded", "")
		// booking takes no answer; its grade is computed at its deadline.
		b := takeExam(t, envOptions{}, `{"exam":"booking"}`)
		wantProblem(t, b.e.do(t, newBodyRequest(http.MethodPost, "/v1/test_helpers/exams/"+b.x.ID+"/answer", b.x.Key, `{}`, "Content-Type", "application/json", "Idempotency-Key", "a")), 422, "capability_unavailable", "")
	})
	t.Run("an answer too late", func(t *testing.T) {
		t.Parallel()
		c := takeExam(t, envOptions{}, `{"exam":"tracking","scale":2}`)
		c.get(t, "/v1/test_helpers/clock")
		c.wait(24*time.Second + 2*examAnswerTime - time.Millisecond)
		if g := c.e.gradeOf(t, c.x.ID, c.x.Key); g.State != "awaiting_answer" || g.Passed != nil || g.Score != nil || g.GradedAt != nil || g.Now != "2026-11-22T12:02:23.999Z" {
			t.Errorf("a millisecond before the last instant to answer: %+v", g)
		}
		c.wait(time.Millisecond)
		wantProblem(t, c.answer(t, `{"consignments":[]}`), 409, "exam_graded", "")
		if g := c.e.gradeOf(t, c.x.ID, c.x.Key); g.State != "graded" || *g.GradedAt != "2026-11-22T12:02:24Z" || g.check("answer.consignments").Detail == nil || !strings.HasPrefix(*g.check("answer.consignments").Detail, "No answer") {
			t.Errorf("graded without an answer: %+v", g)
		}
	})
	t.Run("two answers in flight: one graded", func(t *testing.T) {
		t.Parallel()
		c := takeExam(t, envOptions{}, `{"exam":"order-sync"}`)
		c.get(t, "/v1/test_helpers/clock")
		c.sleep(12 * time.Second)
		var wg sync.WaitGroup
		statuses := make([]int, 8)
		for i := range statuses {
			wg.Add(1)
			go func() {
				defer wg.Done()
				statuses[i] = c.e.do(t, newBodyRequest(http.MethodPost, "/v1/test_helpers/exams/"+c.x.ID+"/answer", c.x.Key, `{"orders":[]}`, "Content-Type", "application/json", "Idempotency-Key", fmt.Sprint("f-", i))).status
			}()
		}
		wg.Wait()
		slices.Sort(statuses)
		if fmt.Sprint(statuses) != "[200 409 409 409 409 409 409 409]" {
			t.Errorf("eight answers at once: %v", statuses)
		}
	})
	t.Run("a grade, read by whom", func(t *testing.T) {
		t.Parallel()
		c := takeExam(t, envOptions{}, `{"exam":"order-sync"}`)
		for _, key := range []string{c.x.Key, c.maker} {
			if g := c.e.gradeOf(t, c.x.ID, key); g.State != "running" || g.Now != "2026-11-22T12:00:00Z" || len(g.Checks) != 12 || g.Checks[0].Result != "pending" || g.Checks[0].Requests == nil {
				t.Errorf("%s: %+v", key, g)
			}
		}
		for _, key := range []string{"sk_test_sandbox_orders", "sk_test_other_all"} {
			wantProblem(t, c.e.get(t, "/v1/test_helpers/exams/"+c.x.ID, key), 404, "not_found", "")
		}
		wantProblem(t, c.e.get(t, "/v1/test_helpers/exams/"+c.x.ID+"?format=xml", c.maker), 422, "invalid_parameter", "format")
		wantProblem(t, c.e.get(t, "/v1/test_helpers/exams/"+c.x.ID+"?format=json&format=json", c.maker), 422, "invalid_parameter", "format")
		wantProblem(t, c.e.get(t, "/v1/test_helpers/exams/"+c.x.ID+"?run=1", c.maker), 422, "unknown_parameter", "run")
		if rep := c.e.get(t, "/v1/test_helpers/exams/"+c.x.ID+"?format=json", c.maker); rep.status != 200 || !strings.HasPrefix(string(rep.body), `{"id":"`+c.x.ID+`","exam":"order-sync","revision":2,"variant":0,"scale":1,"account":"`+c.x.Account+`","state":"running","started_at":"2026-11-22T12:00:00Z","now":"2026-11-22T12:00:00Z","deadline":"2026-11-22T12:00:12Z","graded_at":null,"passed":null,"score":null,"checks":[{"id":"answer.orders","title":`) {
			t.Errorf("the members' order: %s", rep.body)
		}
		// The attempt forgotten with its sandbox: its grade is 404.
		if rep := c.e.do(t, newRequest(http.MethodDelete, "/v1/test_helpers/sandboxes/"+c.x.Account, c.x.Key)); rep.status != 204 {
			t.Fatalf("forgetting the attempt's sandbox: %s", rep)
		}
		wantProblem(t, c.e.get(t, "/v1/test_helpers/exams/"+c.x.ID, c.maker), 404, "not_found", "")
	})
	t.Run("a grade as JUnit", func(t *testing.T) {
		t.Parallel()
		c := takeExam(t, envOptions{}, `{"exam":"booking"}`)
		g := c.grade(t)
		rep := c.e.get(t, "/v1/test_helpers/exams/"+c.x.ID+"?format=junit", c.maker)
		var suite struct {
			XMLName  xml.Name `xml:"testsuite"`
			Name     string   `xml:"name,attr"`
			Tests    int      `xml:"tests,attr"`
			Failures int      `xml:"failures,attr"`
			Cases    []struct {
				Name    string `xml:"name,attr"`
				Failure *struct {
					Message string `xml:"message,attr"`
				} `xml:"failure"`
			} `xml:"testcase"`
		}
		if rep.status != 200 || rep.header.Get("Content-Type") != "application/xml; charset=utf-8" || xml.Unmarshal(rep.body, &suite) != nil {
			t.Fatalf("%s", rep)
		}
		if suite.Name != "exam booking "+c.x.ID || suite.Tests != len(g.Checks) || suite.Failures != 1 || len(suite.Cases) != len(g.Checks) ||
			suite.Cases[0].Name != "state.booked" || suite.Cases[0].Failure == nil || suite.Cases[0].Failure.Message != *g.Checks[0].Detail || suite.Cases[1].Failure != nil {
			t.Errorf("%+v\n%s", suite, rep.body)
		}
	})
}

// TestExamsHeldAgainstAbuse: the red team's cases, each a promise that once did not hold: a
// flood of starts meets the key's rate limit and its 100 attempts not yet graded, beside
// another tenant's sandbox that stays; another key's attempts never shed a running attempt's
// journal; an answer's id with control characters is valid XML in JUnit; the string "null" is
// an id; a 429 is merged whatever the number of targets; an answer in flight is graded
// whatever a read does meanwhile; an attempt is never forgotten for idleness before its
// grading limit; a grade read as JUnit before it is computed is an error, never green.
func TestExamsHeldAgainstAbuse(t *testing.T) {
	t.Parallel()
	t.Run("a flood of starts meets the key's rate limit", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, envOptions{step: -1, quiet: true})
		statuses := map[int]int{}
		var limited reply
		for i := range 40 {
			rep, _ := e.startAttempt(t, "sk_test_sandbox_all", `{"exam":"order-sync"}`, fmt.Sprint("s-", i))
			if statuses[rep.status]++; rep.status == 429 {
				limited = rep
			}
		}
		if statuses[201] != 25 || statuses[429] != 15 || limited.header.Get("Retry-After") == "" || limited.header.Get("RateLimit-Policy") == "" {
			t.Errorf("40 starts at once at -rate 25: %v, the last 429: %s", statuses, limited)
		}
		wantProblem(t, limited, 429, "rate_limited", "")
	})
	t.Run("a key holds at most 100 attempts not yet graded", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, envOptions{step: -1, quiet: true, rate: -1})
		_, other := e.postSandbox(t, "sk_test_other_all", `{"template":"acct_other"}`, "other")
		var first examStartedOut
		for i := range maxHeldByMaker {
			rep, x := e.startAttempt(t, "sk_test_sandbox_all", `{"exam":"order-sync"}`, fmt.Sprint("s-", i))
			if rep.status != 201 {
				t.Fatalf("attempt %d: %s", i+1, rep)
			}
			if i == 0 {
				first = x
			}
		}
		rep, _ := e.startAttempt(t, "sk_test_sandbox_all", `{"exam":"booking"}`, "s-101")
		wantProblem(t, rep, 429, "rate_limited", "")
		if got := rep.header.Get("Retry-After"); got != "132" { // its clock stands 60 s, then 12 s and 60 s to answer
			t.Errorf("Retry-After %q, want 132: the oldest attempt's grading limit", got)
		}
		if rep, _ := e.startAttempt(t, "sk_test_other_all", `{"exam":"booking"}`, "o-1"); rep.status != 201 {
			t.Errorf("another key's start: %s", rep)
		}
		if rep := e.get(t, "/v1/orders", other.Keys[0].Key); rep.status != 200 {
			t.Errorf("another tenant's sandbox: %s", rep)
		}
		// Its oldest attempt graded (by its limit): one more start is taken.
		e.get(t, "/v1/orders", first.Key)
		e.clock.advance(73 * time.Second)
		if rep, _ := e.startAttempt(t, "sk_test_sandbox_all", `{"exam":"booking"}`, "s-102"); rep.status != 201 {
			t.Errorf("a start once the oldest was graded: %s", rep)
		}
		if rep, _ := e.startAttempt(t, "sk_test_sandbox_all", `{"exam":"booking"}`, "s-103"); rep.status != 429 {
			t.Errorf("a start past the 100 again: %s", rep)
		}
	})
	t.Run("another key's attempts never shed a running attempt's evidence", func(t *testing.T) {
		t.Parallel()
		const bound = 128 << 10
		e := newEnv(t, envOptions{step: -1, quiet: true, rate: -1, journalBytes: bound})
		_, victim := e.startAttempt(t, "sk_test_sandbox_all", `{"exam":"order-sync","variant":0}`, "v")
		for i := range 40 {
			e.get(t, fmt.Sprintf("/v1/orders/ord_exam_%04d?i=%d", 1+i%6, i), victim.Key)
		}
		for a := range 20 { // another key's attempts, flooding past the bound
			_, x := e.startAttempt(t, "sk_test_other_all", `{"exam":"tracking"}`, fmt.Sprint("f-", a))
			for i := range 120 {
				e.get(t, fmt.Sprintf("/v1/shipments/shp_x/tracking?pad=%s&i=%d", strings.Repeat("x", 200), i), x.Key)
			}
		}
		if total := e.srv.registry.journalTotal.Load(); total > bound {
			t.Errorf("the journals hold %d bytes, over their bound of %d", total, bound)
		}
		e.clock.advance(time.Second) // the attempt's key past its 10 a second, to read its journal
		kept := e.journalOf(t, victim.Key, "limit=1000")
		if len(kept.Data) != 40 || kept.Dropped != 0 {
			t.Errorf("the running attempt kept %d of its 40 entries, %d dropped", len(kept.Data), kept.Dropped)
		}
	})
	t.Run("an answer's id with control characters is valid XML", func(t *testing.T) {
		t.Parallel()
		c := takeExam(t, envOptions{}, `{"exam":"order-sync"}`)
		c.get(t, "/v1/orders")
		c.until(12 * time.Second)
		if rep := c.answer(t, `{"orders":[{"id":"ord_\u001b[2J\u001b]0;owned\u0007\u0000\ufffe","status":"fulfilled","shipment_id":"null"},{"id":"ord_exam_0003","status":"unfulfilled","shipment_id":"null"}]}`); rep.status != 200 {
			t.Fatalf("the answer: %s", rep)
		}
		g := c.grade(t)
		if d := g.check("answer.links").Detail; d == nil || !strings.Contains(*d, `ord_exam_0003 answered "null", null at the deadline`) {
			t.Errorf(`the string "null" is an id, not null: %v`, d)
		}
		rep := c.e.get(t, "/v1/test_helpers/exams/"+c.x.ID+"?format=junit", c.maker)
		var suite struct {
			Cases []struct {
				Failure *struct {
					Message string `xml:"message,attr"`
				} `xml:"failure"`
			} `xml:"testcase"`
		}
		if err := xml.Unmarshal(rep.body, &suite); err != nil || bytes.ContainsAny(rep.body, "\x1b\x07\x00") || !strings.Contains(suite.Cases[0].Failure.Message, `ord_\u001b[2J\u001b]0;owned\u0007\u0000\ufffe`) {
			t.Errorf("JUnit: %v\n%s", err, rep.body)
		}
	})
	t.Run("a 429 is merged whatever the number of targets", func(t *testing.T) {
		t.Parallel()
		c := takeExam(t, envOptions{}, `{"exam":"tracking"}`)
		for range 3 { // 100 targets three times in one second: 10 answered, the rest 429
			for i := range 100 {
				c.get(t, fmt.Sprintf("/v1/shipments/shp_%03d/tracking", i))
			}
		}
		c.sleep(time.Second) // the key past its 10 a second, to read its journal
		j := c.e.journalOf(t, c.x.Key, "limit=1000")
		repeats := 0
		for _, entry := range j.Data {
			if entry.Repeats != nil {
				repeats += int(*entry.Repeats)
			}
		}
		if len(j.Data) != 110 || repeats != 190 {
			t.Errorf("%d entries with %d repeats, want 110 and 190", len(j.Data), repeats)
		}
		// A 429 that Prefer asked for is an answer of its own, never a repeat.
		for range 3 {
			c.e.get(t, "/v1/shipments/shp_000/tracking", c.x.Key, "Prefer", "code=429")
		}
		c.sleep(time.Second)
		asked := c.e.journalOf(t, c.x.Key, "limit=1000&after="+strconv.FormatUint(j.LastSeq, 10))
		if len(asked.Data) != 3 || asked.Data[0].Simulated == nil || *asked.Data[0].Simulated != "prefer" || asked.Data[2].Repeats != nil {
			t.Errorf("three 429s Prefer asked for: %+v", asked.Data)
		}
	})
	t.Run("an answer in flight is graded whatever a read does", func(t *testing.T) {
		t.Parallel()
		c := takeExam(t, envOptions{}, `{"exam":"order-sync"}`)
		ts := httptest.NewServer(c.e.h)
		defer ts.Close()
		c.get(t, "/v1/orders")
		c.until(12*time.Second + 59*time.Second) // a second before the last instant an answer is taken
		body, w := io.Pipe()
		req, _ := http.NewRequest(http.MethodPost, ts.URL+"/v1/test_helpers/exams/"+c.x.ID+"/answer", body)
		req.Header.Set("Authorization", "Bearer "+c.x.Key)
		req.Header.Set("Idempotency-Key", "late-body")
		done := make(chan *http.Response, 1)
		go func() {
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
			}
			done <- res
		}()
		a := c.e.srv.registry.named[c.x.ID].exam
		for inFlight := false; !inFlight; time.Sleep(time.Millisecond) { // until its headers passed the key's check
			a.mu.Lock()
			inFlight = a.answering > 0
			a.mu.Unlock()
		}
		c.sleep(5 * time.Second) // past the last instant, while the body arrives
		if g := c.e.gradeOf(t, c.x.ID, c.maker); g.State != "awaiting_answer" {
			t.Errorf("a read while an answer's body arrives: %s", g.State)
		}
		io.WriteString(w, `{"orders":[]}`)
		w.Close()
		res := <-done
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 || !strings.Contains(string(b), `"state":"graded"`) || strings.Contains(string(b), "No answer") {
			t.Errorf("the answer in flight: %d %s", res.StatusCode, b)
		}
	})
	t.Run("an attempt is never forgotten for idleness before its grading limit", func(t *testing.T) {
		t.Parallel()
		c := takeExam(t, envOptions{}, `{"exam":"order-sync","scale":60}`)
		c.get(t, "/v1/orders")
		c.wait(sandboxIdle + time.Second) // idle an hour; its hour to answer runs until +72 min
		if rep := c.get(t, "/v1/orders"); rep.status != 200 {
			t.Fatalf("an hour idle, before its grading limit: %s", rep)
		}
		c.wait(80*time.Minute + sandboxIdle)
		wantProblem(t, c.get(t, "/v1/orders"), 401, "invalid_api_key", "")
	})
	t.Run("a grade read as JUnit before it is computed is an error", func(t *testing.T) {
		t.Parallel()
		c := takeExam(t, envOptions{}, `{"exam":"tracking"}`)
		rep := c.e.get(t, "/v1/test_helpers/exams/"+c.x.ID+"?format=junit", c.maker)
		if rep.status != 200 || !strings.Contains(string(rep.body), `tests="11" failures="0" errors="11" skipped="0"`) || strings.Count(string(rep.body), `<error message="not graded yet">`) != 11 || strings.Contains(string(rep.body), "<skipped") {
			t.Errorf("%s", rep.body)
		}
	})
}

// FuzzExamBodies: whatever body a client sends to start an attempt or to answer one, the
// answer is the document's: 201 (an attempt, forgotten again) or 200 (a grade), or a 400,
// 409 or 422 problem; never a 500, never a panic.
func FuzzExamBodies(f *testing.F) {
	e := newEnv(f, envOptions{rate: -1, quiet: true, step: -1})
	for _, body := range []string{`{"exam":"order-sync"}`, `{"exam":"tracking","revision":1,"scale":60}`, `{"exam":"booking","scale":1.5}`, `{"exam":null}`, `{"scale":-1,"exam":"x"}`,
		`{"orders":[{"id":"ord_exam_0001","status":"fulfilled","shipment_id":null}]}`, `{"consignments":[{"shipment_id":"shp_exam_t1","status":"delivered"}]}`, `{"orders":[null,{}]}`, `{"orders":null}`, "{\"orders\":[{\"id\":\"\xff\"}]}", `[]`} {
		f.Add(body)
	}
	n := 0
	f.Fuzz(func(t *testing.T, body string) {
		n++
		rep, x := e.startAttempt(t, "sk_test_sandbox_all", body, fmt.Sprint("fuzz-", n))
		switch rep.status {
		case http.StatusCreated:
			e.do(t, newRequest(http.MethodDelete, "/v1/test_helpers/sandboxes/"+x.Account, x.Key))
		case http.StatusBadRequest, http.StatusUnprocessableEntity:
		default:
			t.Fatalf("starting with %q = %s", body, rep)
		}
		for _, exam := range []string{"order-sync", "tracking", "booking"} {
			_, a := e.startAttempt(t, "sk_test_sandbox_all", `{"exam":"`+exam+`"}`, fmt.Sprint("fuzz-", n, exam))
			e.clock.advance(examClockWait + 12*time.Second) // past its deadline: an answer is graded
			rep := e.do(t, newBodyRequest(http.MethodPost, "/v1/test_helpers/exams/"+a.ID+"/answer", a.Key, body, "Content-Type", "application/json", "Idempotency-Key", "a"))
			switch rep.status {
			case http.StatusOK, http.StatusBadRequest, http.StatusUnprocessableEntity:
			default:
				t.Fatalf("answering %s with %q = %s", exam, body, rep)
			}
			e.do(t, newRequest(http.MethodDelete, "/v1/test_helpers/sandboxes/"+a.Account, a.Key))
		}
	})
}

// TestForgettingRacesAnExamAnswer: an attempt's answer, paused once it holds its
// Idempotency-Key, and the attempt's sandbox forgotten meanwhile: the answer is 401
// invalid_api_key (nothing to grade is anyone's), its replay too, and the grade 404 to the key
// that started it; then an answer and a DELETE sent together end either way, under -race.
func TestForgettingRacesAnExamAnswer(t *testing.T) {
	t.Parallel()
	c := takeExam(t, envOptions{rate: -1}, `{"exam":"order-sync"}`)
	c.get(t, "/v1/orders")
	c.sleep(12 * time.Second)
	paused, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	c.e.srv.registry.hooks.claimed = func(_ *tenant, key string) { once.Do(func() { close(paused); <-release }) }
	answer := c.e.serveAsync(t, newBodyRequest(http.MethodPost, "/v1/test_helpers/exams/"+c.x.ID+"/answer", c.x.Key, `{"orders":[]}`, "Content-Type", "application/json", "Idempotency-Key", "a"))
	<-paused
	if rep := c.e.do(t, newRequest(http.MethodDelete, "/v1/test_helpers/sandboxes/"+c.x.Account, c.x.Key)); rep.status != 204 {
		t.Fatalf("the DELETE: %s", rep)
	}
	close(release)
	wantProblem(t, within(t, "the answer", answer), 401, "invalid_api_key", "")
	wantProblem(t, c.answer(t, `{"orders":[]}`), 401, "invalid_api_key", "")
	wantProblem(t, c.e.get(t, "/v1/test_helpers/exams/"+c.x.ID, c.maker), 404, "not_found", "")
	if h := sandboxHoldings(c.e); h != (holdings{}) {
		t.Errorf("the books hold %+v of the forgotten attempt", h)
	}
	for i := range 20 { // together, unpaused: each ends, and the attempt is gone
		d := takeExam(t, envOptions{rate: -1}, `{"exam":"order-sync"}`)
		d.get(t, "/v1/orders")
		d.sleep(12 * time.Second)
		answer := d.e.serveAsync(t, newBodyRequest(http.MethodPost, "/v1/test_helpers/exams/"+d.x.ID+"/answer", d.x.Key, `{"orders":[]}`, "Content-Type", "application/json", "Idempotency-Key", fmt.Sprint("b-", i)))
		deletion := d.e.serveAsync(t, newRequest(http.MethodDelete, "/v1/test_helpers/sandboxes/"+d.x.Account, d.x.Key))
		if rep := within(t, "the answer", answer); rep.status != 200 && rep.status != 401 {
			t.Errorf("an answer beside the DELETE: %s", rep)
		}
		if rep := within(t, "the DELETE", deletion); rep.status != 204 && rep.status != 401 {
			t.Errorf("the DELETE beside an answer: %s", rep)
		}
		wantProblem(t, d.e.get(t, "/v1/test_helpers/exams/"+d.x.ID, d.maker), 404, "not_found", "")
	}
}

// TestExamAttemptClock: an attempt's clock stands at its start until its key's first request
// to a route other than the exam routes, or 60 s after its creation; then it runs and cannot
// be moved; -faults never applies to it, and its key is limited to 10 requests a second
// whatever -rate.
func TestExamAttemptClock(t *testing.T) {
	t.Parallel()
	t.Run("it stands until the key's first request", func(t *testing.T) {
		t.Parallel()
		c := takeExam(t, envOptions{}, `{"exam":"order-sync"}`)
		c.e.clock.advance(30 * time.Second) // the client boots: the exam routes leave the clock as it is
		if g := c.e.gradeOf(t, c.x.ID, c.x.Key); g.Now != "2026-11-22T12:00:00Z" {
			t.Errorf("before the first request: now %s", g.Now)
		}
		c.answer(t, `{"orders":[]}`) // 409 exam_running: an exam route too
		c.e.clock.advance(20 * time.Second)
		if g := c.e.gradeOf(t, c.x.ID, c.x.Key); g.Now != "2026-11-22T12:00:00Z" {
			t.Errorf("a read and an answer later, still before the first request: now %s", g.Now)
		}
		clock := c.e.readClock(t, c.x.Key)
		c.e.clock.advance(2 * time.Second)
		if g := c.e.gradeOf(t, c.x.ID, c.maker); clock.Now != "2026-11-22T12:00:00Z" || g.Now != "2026-11-22T12:00:02Z" || g.State != "running" {
			t.Errorf("the first request at the start: clock %+v, then the grade's now %s", clock, g.Now)
		}
	})
	t.Run("or 60 s after its creation", func(t *testing.T) {
		t.Parallel()
		c := takeExam(t, envOptions{}, `{"exam":"order-sync","scale":5}`)
		c.e.clock.advance(61 * time.Second)
		if g := c.e.gradeOf(t, c.x.ID, c.maker); g.Now != "2026-11-22T12:00:01Z" {
			t.Errorf("61 s after its creation: now %s, want a second past the start", g.Now)
		}
	})
	t.Run("it cannot be moved", func(t *testing.T) {
		t.Parallel()
		c := takeExam(t, envOptions{rate: -1, faults: "rate=1,codes=500"}, `{"exam":"order-sync"}`)
		rep := c.e.do(t, newBodyRequest(http.MethodPost, "/v1/test_helpers/clock", c.x.Key, `{"frozen_time":"2026-11-22T12:00:30Z"}`, "Content-Type", "application/json"))
		wantProblem(t, rep, 422, "capability_unavailable", "")
		wantProblem(t, c.e.get(t, "/v1/orders?limit=1", c.x.Key, "Prefer", `clock="start+10s"`), 422, "capability_unavailable", "")
		// -faults rate=1 fails every request of a dataset's key, none of the attempt's; -rate 0
		// (here -1), yet the attempt's key has 10 requests a second, a burst of 10 (full again a
		// second after the two above).
		if rep := c.e.get(t, "/v1/orders/ord_sbx_0001", "sk_test_sandbox_all"); rep.status < 429 {
			t.Errorf("-faults rate=1 with a dataset key: %s", rep)
		}
		c.sleep(time.Second)
		for i := range examRate {
			if rep := c.get(t, "/v1/orders?limit=1"); rep.status != 200 || rep.header.Get("RateLimit-Policy") != `"default";q=10;w=1` {
				t.Fatalf("request %d: %s %v", i+1, rep, rep.header)
			}
		}
		rep = c.get(t, "/v1/orders?limit=1")
		wantProblem(t, rep, 429, "rate_limited", "")
		if rep.header.Get("Retry-After") != "1" {
			t.Errorf("Retry-After %q", rep.header.Get("Retry-After"))
		}
		c.sleep(100 * time.Millisecond)
		if rep := c.get(t, "/v1/orders?limit=1"); rep.status != 200 {
			t.Errorf("a tenth of a second later: %s", rep)
		}
	})
}

// TestExamGradeHolds: a grade is computed once, from the entries that arrived before its
// grading instant: read twice, and read after more requests, it is the same (but its now);
// with -journal 0 an attempt's journal is kept whole, so the grade is the one it is with the
// journal on; a flood of 429s grows the journal by one entry a second, and an attempt whose
// journal lost entries fails journal.complete.
func TestExamGradeHolds(t *testing.T) {
	t.Parallel()
	withoutNow := func(g gradeOut) gradeOut { g.Now = ""; return g }
	t.Run("read twice, and after more requests", func(t *testing.T) {
		t.Parallel()
		c := takeExam(t, envOptions{}, `{"exam":"order-sync"}`)
		c.get(t, "/v1/test_helpers/clock")
		syncOrders(time.Second, 2*time.Second, 6*time.Second, false)(t, c) // fails: it stops at +6 s
		first := c.grade(t)
		c.get(t, "/v1/orders?created_from=2026-11-22T11:00:00Z")
		c.e.do(t, newBodyRequest(http.MethodPost, "/v1/test_helpers/shipments", c.x.Key, `{"reference":"LATE","order_id":"ord_exam_0003"}`, "Content-Type", "application/json", "Idempotency-Key", "late"))
		c.e.clock.advance(2 * time.Minute)
		for _, key := range []string{c.maker, c.x.Key} {
			if again := c.e.gradeOf(t, c.x.ID, key); !reflect.DeepEqual(withoutNow(again), withoutNow(first)) || again.Now == first.Now {
				t.Errorf("read again with %s:\n%+v\nfirst:\n%+v", key, again, first)
			}
		}
	})
	t.Run("-journal 0 loses no evidence", func(t *testing.T) {
		t.Parallel()
		for _, client := range []examScript{syncOrders(time.Second, 0, 12*time.Second, false), syncOrders(2*time.Second, 0, 4*time.Second, true)} {
			var grades []gradeOut
			for _, journal := range []int{0, -1} {
				c := takeExam(t, envOptions{journal: journal}, `{"exam":"order-sync"}`)
				c.get(t, "/v1/test_helpers/clock")
				client(t, c)
				g := c.grade(t)
				g.ID, g.Account, g.Now = "", "", ""
				grades = append(grades, g)
				if journal == -1 {
					wantProblem(t, c.e.get(t, "/v1/test_helpers/requests", "sk_test_sandbox_all"), 404, "not_found", "") // the datasets' journals are off
					if out := c.e.journalOf(t, c.x.Key, "limit=1000"); len(out.Data) == 0 || out.Dropped != 0 {
						t.Errorf("the attempt's journal with -journal 0: %d entries, %d dropped", len(out.Data), out.Dropped)
					}
				}
			}
			if !reflect.DeepEqual(grades[0], grades[1]) {
				t.Errorf("with the journal on:\n%s\nwith -journal 0:\n%s", gradeText(grades[0]), gradeText(grades[1]))
			}
		}
	})
	t.Run("a flood of 429s: one entry a second", func(t *testing.T) {
		t.Parallel()
		c := takeExam(t, envOptions{}, `{"exam":"order-sync"}`)
		c.get(t, "/v1/test_helpers/clock")
		for second := range 3 {
			for range 500 {
				c.get(t, "/v1/orders/ord_exam_0003")
				c.get(t, "/v1/orders/ord_exam_0004")
			}
			if second < 2 {
				c.sleep(time.Second)
			}
		}
		c.sleep(time.Second)
		out := c.e.journalOf(t, c.x.Key, "limit=1000")
		counts := map[string]int{}
		var repeats int32
		for _, e := range out.Data {
			if e.Route != "/v1/orders/{id}" {
				continue // the clock's read
			}
			counts[fmt.Sprint(e.Status)]++
			if (e.Status == 429) != (e.Repeats != nil) {
				t.Errorf("entry %d: %d with repeats %v", e.Seq, e.Status, e.Repeats)
			}
			if e.Repeats != nil {
				repeats += *e.Repeats
			}
		}
		// 9 (the clock's read took a token), 10 and 10 answered 200; a 429 entry a target a
		// second; each of the other 2,965 counted once.
		if counts["200"] != 29 || counts["429"] != 6 || repeats != 3000-29-6 {
			t.Errorf("entries %v, repeats %d", counts, repeats)
		}
		// Reading the journal, and the findings, is limited too; the grade counts the repeats
		// as requests inside the window.
		c.until(12 * time.Second)
		c.answer(t, `{"orders":[]}`)
		g := c.grade(t)
		if d := g.check("findings.retry_too_soon").Detail; d == nil || !regexp.MustCompile(`^GET /v1/orders/ord_exam_000[34] was sent 14[89]\d times before the Retry-After .* \(and 1 more\)\.$`).MatchString(*d) || g.check("journal.complete").Result != "pass" {
			t.Errorf("%s", gradeText(g))
		}
	})
	t.Run("the journals' bound drops an attempt's entries last", func(t *testing.T) {
		t.Parallel()
		const bound = 128 << 10
		c := takeExam(t, envOptions{journalBytes: bound, rate: -1}, `{"exam":"order-sync"}`)
		for i := range 100 {
			c.get(t, fmt.Sprintf("/v1/orders/ord_exam_%04d", 1+i%6))
			c.sleep(100 * time.Millisecond)
		}
		for i := range 3000 { // a dataset's key floods past the bound: its own entries go
			c.e.get(t, "/v1/orders/ord_sbx_0001?pad="+strings.Repeat("x", i%50), "sk_test_sandbox_all")
		}
		if total := c.e.srv.registry.journalTotal.Load(); total > bound {
			t.Errorf("the journals hold %d bytes, over their bound of %d", total, bound)
		}
		if j := c.e.journalOf(t, "sk_test_sandbox_all", "limit=1"); j.Dropped == 0 && j.LastSeq < 3000 {
			t.Errorf("the dataset's journal dropped nothing: %+v", j)
		}
		kept := c.e.journalOf(t, c.x.Key, "limit=1000")
		if len(kept.Data) != 100 || kept.Dropped != 0 {
			t.Errorf("the attempt kept %d of its 100 entries, %d dropped", len(kept.Data), kept.Dropped)
		}
		c.until(12 * time.Second)
		c.answer(t, `{"orders":[]}`)
		if g := c.grade(t); g.check("journal.complete").Result != "pass" {
			t.Errorf("%s", gradeText(g))
		}
		// The attempt alone past the bound: its oldest entries go, counted, and the grade
		// says so.
		d := takeExam(t, envOptions{journalBytes: 32 << 10, rate: -1}, `{"exam":"order-sync"}`)
		for i := range 400 { // within its 10 a second: each answered, each journaled
			d.get(t, fmt.Sprintf("/v1/orders/ord_exam_0001?pad=%s", strings.Repeat("x", i%50)))
			d.sleep(100 * time.Millisecond)
		}
		d.answer(t, `{"orders":[]}`)
		if g := d.grade(t); g.check("journal.complete").Result != "fail" || !strings.Contains(*g.check("journal.complete").Detail, "dropped to keep every journal within") {
			t.Errorf("an attempt past the bound alone:\n%s", gradeText(g))
		}
	})
	t.Run("a journal that lost entries fails journal.complete", func(t *testing.T) {
		t.Parallel()
		c := takeExam(t, envOptions{}, `{"exam":"tracking"}`)
		for i := range maxExamEntries + 7 { // each its own target: each 429 its own entry
			c.get(t, fmt.Sprintf("/v1/shipments/shp_exam_t%d/tracking", i))
		}
		c.until(12 * time.Second)
		c.answer(t, `{"consignments":[]}`)
		g := c.grade(t)
		if d := g.check("journal.complete").Detail; d == nil || !strings.HasPrefix(*d, "7 requests of the attempt were not kept in its journal") || g.check("journal.complete").Requests == nil || len(g.check("journal.complete").Requests) != 0 {
			t.Errorf("%s", gradeText(g))
		}
	})
}

// BenchmarkExamStart: making an attempt (its sandbox, its key, its clock), through the
// handler chain: the contract's bound is 5 ms.
func BenchmarkExamStart(b *testing.B) {
	e := newEnv(b, envOptions{quiet: true, rate: -1, step: -1})
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		rec := httptest.NewRecorder()
		if i%maxHeldByMaker == maxHeldByMaker-1 { // those made so far past their grading limits: a key holds 100 not yet graded
			e.clock.advance(200 * time.Second)
		}
		e.h.ServeHTTP(rec, newBodyRequest(http.MethodPost, "/v1/test_helpers/exams", "sk_test_sandbox_all", `{"exam":"order-sync"}`, "Idempotency-Key", fmt.Sprint("k-", i)))
		if rec.Code != 201 {
			b.Fatalf("%d %s", rec.Code, rec.Body)
		}
	}
}

// BenchmarkExamGrade: judging an attempt whose journal is full (maxExamEntries entries,
// reads of every kind, 429s among them) and its answer: the contract's bound is 50 ms.
func BenchmarkExamGrade(b *testing.B) {
	c := fullAttempt(b)
	t := c.e.srv.registry.named[c.x.ID]
	answer, err := readExamAnswer([]byte(`{"orders":[{"id":"ord_exam_0001","status":"fulfilled","shipment_id":"shp_exam_1"}]}`), t.exam.def)
	if err != nil {
		b.Fatal(err)
	}
	at := t.exam.lastAnswer().Add(-time.Second) // after every entry: all of them judged
	if c.at >= at.Sub(t.exam.start) {
		b.Fatalf("the entries run to +%v, past the grading instant", c.at)
	}
	b.ReportAllocs()
	for b.Loop() {
		gradeOf(t, at, answer)
	}
}

// fullAttempt is an order-sync attempt at scale 60 whose journal holds the most entries an
// attempt's keeps (maxExamEntries), every one a 200 GET of the orders: lists, pages of a
// status, windows and orders by id, one every 100 ms.
func fullAttempt(b *testing.B) *examTaker {
	c := takeExam(b, envOptions{}, `{"exam":"order-sync","scale":60}`)
	for i := 0; i < maxExamEntries; i++ {
		switch i % 4 {
		case 0:
			c.get(b, "/v1/orders")
		case 1:
			c.get(b, fmt.Sprintf("/v1/orders/ord_exam_%04d", 1+i%6))
		case 2:
			c.get(b, "/v1/orders?status=fulfilled&limit=100")
		default:
			c.get(b, fmt.Sprintf("/v1/orders?created_from=2026-11-22T11:5%d:00Z", i%10))
		}
		c.wait(100 * time.Millisecond)
	}
	if lost := c.e.srv.registry.named[c.x.ID].journalLost(); lost != 0 {
		b.Fatalf("lost %d", lost)
	}
	return c
}

// BenchmarkExamTrace: GET /v1/test_helpers/exams/{id}/trace of a graded attempt whose
// journal is full (20,000 entries, every read's text rendered again): the contract's bound
// is 2 s.
func BenchmarkExamTrace(b *testing.B) {
	c := fullAttempt(b)
	if rep := c.answer(b, `{"orders":[]}`); rep.status != 200 {
		b.Fatalf("the answer: %s", rep)
	}
	b.ReportAllocs()
	for b.Loop() {
		w := httptest.NewRecorder()
		c.e.h.ServeHTTP(w, newRequest(http.MethodGet, "/v1/test_helpers/exams/"+c.x.ID+"/trace", c.x.Key)) // the handler alone: the env's checks of an answer would read 32 MiB
		if w.Code != 200 {
			b.Fatalf("%d", w.Code)
		}
		b.ReportMetric(float64(w.Body.Len())/(1<<20), "MiB")
	}
}

// BenchmarkExamRegrade: exam regrade's judging of that trace (its file read aside): the
// contract's bound is 1 s.
func BenchmarkExamRegrade(b *testing.B) {
	c := fullAttempt(b)
	if rep := c.answer(b, `{"orders":[]}`); rep.status != 200 {
		b.Fatalf("the answer: %s", rep)
	}
	trace := c.e.get(b, "/v1/test_helpers/exams/"+c.x.ID+"/trace", c.x.Key).body
	b.ReportAllocs()
	for b.Loop() {
		recorded, found, err := regrade(trace, -1)
		if err != nil || len(gradeDiffers(recorded, found, false)) > 0 {
			b.Fatalf("%v %v", err, gradeDiffers(recorded, found, false))
		}
	}
}

// examCLI runs go run . exam in this process against the env's handler served over HTTP; a
// grade's wait between reads moves the env's clock instead of waiting.
func examCLI(t *testing.T, e *env, base string, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	sleep := func(ctx context.Context, d time.Duration) error {
		e.clock.advance(d)
		return ctx.Err()
	}
	getenv := func(k string) string {
		if k == "SANDBOX_EXAM_BASE_URL" {
			return cmp.Or(env[k], base)
		}
		return env[k]
	}
	status := runExam(context.Background(), args, examDeps{getenv: getenv, stdout: &stdout, stderr: &stderr, sleep: sleep, now: e.clock.now})
	return status, stdout.String(), stderr.String()
}

// waitingLines drops exam grade's lines that say what it waits for.
func waitingLines(errs string) string {
	return regexp.MustCompile(`(?m)^sandbox exam: waiting for the grade of .*\n`).ReplaceAllString(errs, "")
}

// TestExamCommand: go run . exam list, start and grade, each of their formats, flags before
// and after the operand, exit 0 for a pass, 1 for a failure, 2 for what could not be graded,
// and the key never written.
func TestExamCommand(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{step: -1, quiet: true})
	ts := httptest.NewServer(e.h)
	defer ts.Close()
	base := ts.URL + "/v1"
	t.Run("list", func(t *testing.T) {
		status, out, errs := examCLI(t, e, base, nil, "list")
		if status != 0 || errs != "" || !strings.HasPrefix(out, "order-sync (revision 2, 12 s): Keep a copy of the imported orders\n  Keep a copy of this account's imported orders") || strings.Count(out, "\n") != 9 {
			t.Errorf("%d %q\n%s", status, errs, out)
		}
		status, out, _ = examCLI(t, e, base, nil, "list", "-format", "json")
		if status != 0 || !strings.HasPrefix(out, `{"data":[{"name":"order-sync","revision":2,`) {
			t.Errorf("%d %s", status, out)
		}
	})
	// start, a reference client, then grade: each format, flags after the operand.
	start := func(t *testing.T, args ...string) *examTaker {
		status, out, errs := examCLI(t, e, base, nil, append([]string{"start", "-format", "env", "-variant", "0"}, args...)...)
		m := regexp.MustCompile(`^SANDBOX_BASE_URL='([^']+)'\nSANDBOX_KEY='(sk_test_[a-z2-7]{32})'\nSANDBOX_EXAM='(exm_[a-z2-7]{20})'\nSANDBOX_EXAM_GIVEN='(\{.*\})'\n$`).FindStringSubmatch(out)
		if status != 0 || errs != "" || m == nil || m[1] != base {
			t.Fatalf("%d %q %q", status, out, errs)
		}
		g := e.gradeOf(t, m[3], m[2])
		return &examTaker{e: e, x: examStartedOut{ID: m[3], Key: m[2], Scale: g.Scale, Given: json.RawMessage(m[4])}, maker: "sk_test_sandbox_all"}
	}
	t.Run("a pass, each format", func(t *testing.T) {
		c := start(t, "order-sync")
		c.get(t, "/v1/test_helpers/clock")
		syncOrders(time.Second, 0, 12*time.Second, false)(t, c)
		status, out, errs := examCLI(t, e, base, nil, "grade", c.x.ID)
		if status != 0 || errs != "" || !strings.HasPrefix(out, "exam order-sync "+c.x.ID+" (revision 2, variant 0, scale 1): passed, 12/12\n  PASS  answer.orders\n") || !strings.Contains(out, "  PASS  journal.kept_current (margin ") {
			t.Errorf("%d %q\n%s", status, errs, out)
		}
		status, out, _ = examCLI(t, e, base, nil, "grade", c.x.ID, "-format", "json")
		if status != 0 || !strings.HasPrefix(out, `{"id":"`+c.x.ID+`","exam":"order-sync","revision":2,"variant":0,`) || !strings.Contains(out, `"passed":true,"score":"12/12"`) {
			t.Errorf("%d %s", status, out)
		}
		status, out, _ = examCLI(t, e, base, nil, "-format=junit", "grade", c.x.ID)
		if status != 0 || !strings.Contains(out, `<testsuite name="exam order-sync `+c.x.ID+`" tests="12" failures="0" errors="0" skipped="0"`) || !strings.Contains(out, `<property name="variant" value="0"/>`) {
			t.Errorf("%d %s", status, out)
		}
	})
	t.Run("a failure polls until the grade, and says so", func(t *testing.T) {
		c := start(t, "-scale", "1", "tracking")
		if !strings.Contains(string(c.x.Given), `"shipment_id":"shp_exam_t1","tracking_number":"EXT1000000001"`) {
			t.Errorf("SANDBOX_EXAM_GIVEN: %s", c.x.Given)
		}
		c.get(t, "/v1/test_helpers/clock") // the client's first request: the clock runs
		status, out, errs := examCLI(t, e, base, nil, "grade", "-format", "text", c.x.ID)
		if status != 1 || waitingLines(errs) != "" || !strings.HasPrefix(errs, "sandbox exam: waiting for the grade of "+c.x.ID+": running, 2026-11-22T12:00:") || strings.Count(errs, "\n") > 12 ||
			!strings.HasPrefix(out, "exam tracking "+c.x.ID+" (revision 2, variant 0, scale 1): FAILED, 8/11\n  FAIL  answer.consignments: No answer: ") {
			t.Errorf("%d %q\n%s", status, errs, out)
		}
	})
	t.Run("what cannot be graded", func(t *testing.T) {
		c := start(t, "booking")
		for _, tt := range []struct {
			args []string
			env  map[string]string
			err  string
		}{
			{[]string{}, nil, "want exam list, exam start NAME, exam grade ID, exam run NAME -- COMMAND, exam lint FILE or exam regrade FILE"},
			{[]string{"grade"}, nil, "exam grade takes one ID, given 0"},
			{[]string{"grade", "a", "b"}, nil, "exam grade takes one ID, given 2"},
			{[]string{"list", "x"}, nil, `exam list takes no argument, not "x"`},
			{[]string{"grade", c.x.ID, "-scale", "2"}, nil, "-scale is exam start's and exam run's"},
			{[]string{"grade", c.x.ID, "-variant", "2"}, nil, "-variant is exam start's and exam run's"},
			{[]string{"start", "order-sync", "-variant", "1", "-variant", "2"}, nil, "exam start takes one -variant"},
			{[]string{"start", "order-sync", "-variant", "-1"}, nil, `invalid value "-1" for flag -variant`},
			{[]string{"start", "order-sync", "-attempts", "2"}, nil, "-attempts is exam run's"},
			{[]string{"start", "order-sync", "--", "true"}, nil, "only exam run takes a command after --"},
			{[]string{"run", "order-sync"}, nil, "exam run takes the client's command after --"},
			{[]string{"run", "order-sync", "-attempts", "1", "-variant", "1", "-variant", "2", "--", "true"}, nil, "-attempts 1 is fewer than the 2 variants asked for"},
			{[]string{"run", "order-sync", "-attempts", "101", "--", "true"}, nil, `invalid value "101" for flag -attempts`},
			{[]string{"start", "order-sync", "-scale", "61"}, nil, `invalid value "61" for flag -scale`},
			{[]string{"start", "order-sync", "-format", "text"}, nil, "-format: exam start writes json or env"},
			{[]string{"start", "order-sync"}, map[string]string{"SANDBOX_EXAM_SCALE": "x"}, `invalid value "x" for SANDBOX_EXAM_SCALE`},
			{[]string{"start", "billing"}, nil, "answered 422 invalid_parameter (exam): exam names an exam of the catalogue"},
			{[]string{"grade", c.x.ID}, map[string]string{"SANDBOX_EXAM_KEY": "sk_test_other_all"}, "answered 404 not_found"},
			{[]string{"grade", c.x.ID}, map[string]string{"SANDBOX_EXAM_KEY": "short"}, "SANDBOX_EXAM_KEY: shorter than"},
			{[]string{"list"}, map[string]string{"SANDBOX_EXAM_BASE_URL": ts.URL}, "answered 404 route_not_found: No operation is served at this path."},
			{[]string{"list", "-base-url", "ftp://x"}, nil, "want an absolute http or https URL"},
		} {
			status, out, errs := examCLI(t, e, base, tt.env, tt.args...)
			if status != 2 || out != "" || !strings.HasPrefix(errs, "sandbox exam: ") || !strings.Contains(errs, tt.err) {
				t.Errorf("%v: %d %q %q, want 2 and %q", tt.args, status, out, errs, tt.err)
			}
		}
	})
	t.Run("a grade never computed", func(t *testing.T) {
		// A server whose clock passes the deadline and never grades: exam gives up 70 s past
		// it, times the scale.
		for _, tt := range []struct {
			scale, reads int
			by, after    string
		}{{1, 83, "12:01:23", "1m10s"}, {2, 153, "12:02:33", "2m20s"}} {
			reads := 0
			stuck := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				reads++
				now := testNow.Add(time.Duration(reads) * time.Second)
				fmt.Fprintf(w, `{"id":"exm_aaaaaaaaaaaaaaaaaaaa","exam":"order-sync","revision":2,"variant":0,"scale":%d,"state":"awaiting_answer","now":%q,"deadline":"2026-11-22T12:00:12Z","graded_at":null,"passed":null,"score":null,"checks":[{"id":"answer.orders","result":"pending","detail":null,"requests":[],"margin_ms":null}]}`, tt.scale, formatTimestamp(now))
			}))
			status, out, errs := examCLI(t, e, stuck.URL+"/v1", nil, "grade", "exm_aaaaaaaaaaaaaaaaaaaa")
			stuck.Close()
			if status != 2 || out != "" || reads != tt.reads || !strings.Contains(errs, "the grade of exm_aaaaaaaaaaaaaaaaaaaa was not computed by 2026-11-22T"+tt.by+"Z, "+tt.after+" after its deadline (both on the attempt's clock)") {
				t.Errorf("scale %d: %d %q %q after %d reads", tt.scale, status, out, errs, reads)
			}
		}
	})
	t.Run("the key is never written", func(t *testing.T) {
		echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(401)
			fmt.Fprintf(w, `{"code":"invalid_api_key","detail":"no such key: %s"}`, strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
		}))
		defer echo.Close()
		status, _, errs := examCLI(t, e, echo.URL+"/v1", map[string]string{"SANDBOX_EXAM_KEY": "sk_test_secretsecretsecret"}, "list")
		if status != 2 || strings.Contains(errs, "secretsecret") || !strings.Contains(errs, "no such key: $SANDBOX_EXAM_KEY") {
			t.Errorf("%d %q", status, errs)
		}
	})
	t.Run("connection refused says where", func(t *testing.T) {
		l, _ := net.Listen("tcp", "127.0.0.1:0")
		addr := l.Addr().String()
		l.Close()
		status, _, errs := examCLI(t, e, "http://"+addr+"/v1", nil, "list")
		if status != 2 || !strings.Contains(errs, "connection refused: is the sandbox running at http://"+addr+"/v1?") {
			t.Errorf("%d %q", status, errs)
		}
	})
}

// TestExamCommandAgainstAHostileServer: exam treats every server as the kit does: a key it
// echoes is masked, terminal controls and what XML forbids never reach standard output or
// error whatever the format, an answer not of the contract's shape is refused (exit 2), and
// a grade whose now stands, or whose scale is huge, is given up by the wall clock.
func TestExamCommandAgainstAHostileServer(t *testing.T) {
	t.Parallel()
	const key = "sk_test_secretsecretsecret"
	nasty := `\u001b[2J\u001b]0;owned\u0007\u0000\ufffe\u009b` + key
	graded := `{"id":"exm_aaaaaaaaaaaaaaaaaaaa","exam":"order-sync` + nasty + `","revision":2,"variant":3,"scale":1,"state":"graded","now":"2026-11-22T12:01:00Z","deadline":"2026-11-22T12:00:12Z","graded_at":"2026-11-22T12:00:30Z","passed":false,"score":"0/1",` +
		`"checks":[{"id":"answer.orders` + nasty + `","result":"fail","detail":"ord_` + nasty + `","requests":[2,63],"margin_ms":null}]}`
	started := `{"id":"exm_aaaaaaaaaaaaaaaaaaaa","exam":"order-sync","revision":2,"variant":3,"scale":1,"account":"acct_aaaaaaaaaaaaaaaaaaaa","key":"sk_test_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","started_at":"2026-11-22T12:00:00Z","deadline":"2026-11-22T12:00:12Z","task":"t` + nasty + `","given":{"k":"` + nasty + `"}}`
	var answer atomic.Value
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodPost {
			w.WriteHeader(201)
		}
		io.WriteString(w, answer.Load().(string))
	}))
	defer ts.Close()
	e := newEnv(t, envOptions{step: -1, quiet: true})
	clean := func(t *testing.T, what, text string) {
		t.Helper()
		for _, bad := range []string{"\x1b", "\x07", "\x00", "\ufffe", "\u009b", "secretsecret"} {
			if strings.Contains(text, bad) {
				t.Errorf("%s holds %q: %q", what, bad, text)
			}
		}
	}
	for _, format := range []string{"text", "json", "junit"} {
		answer.Store(graded)
		status, out, errs := examCLI(t, e, ts.URL+"/v1", map[string]string{"SANDBOX_EXAM_KEY": key}, "grade", "exm_aaaaaaaaaaaaaaaaaaaa", "-format", format)
		if status != 1 || out == "" {
			t.Errorf("%s: %d %q %q", format, status, out, errs)
		}
		clean(t, format, out+errs)
		if format == "junit" {
			var suite struct {
				Cases []struct {
					Failure struct {
						Message string `xml:"message,attr"`
						Text    string `xml:",chardata"`
					} `xml:"failure"`
				} `xml:"testcase"`
			}
			if err := xml.Unmarshal([]byte(out), &suite); err != nil || len(suite.Cases) != 1 || suite.Cases[0].Failure.Text != "journal entries 2 and 63" {
				t.Errorf("the JUnit report: %v %+v\n%s", err, suite, out)
			}
		}
	}
	for _, format := range []string{"json", "env"} {
		answer.Store(started)
		status, out, errs := examCLI(t, e, ts.URL+"/v1", map[string]string{"SANDBOX_EXAM_KEY": key}, "start", "order-sync", "-format", format)
		if status != 0 || !strings.Contains(out, "sk_test_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa") {
			t.Errorf("%s: %d %q %q", format, status, out, errs)
		}
		clean(t, format, out+errs)
	}
	for _, tt := range []struct{ name, body, args string }{
		{"its key echoed as the attempt's", strings.Replace(started, "sk_test_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", key, 1), "start order-sync"},
		{"an id not of its form", strings.Replace(started, "exm_aaaaaaaaaaaaaaaaaaaa", `exm_\u001b[2J`, 1), "start order-sync"},
		{"a scale outside 1 to 60", strings.Replace(graded, `"scale":1`, `"scale":100000`, 1), "grade exm_aaaaaaaaaaaaaaaaaaaa"},
		{"a score unlike its checks", strings.Replace(graded, `"0/1"`, `"1/1"`, 1), "grade exm_aaaaaaaaaaaaaaaaaaaa"},
		{"not JSON", "\x1b[2J" + key, "grade exm_aaaaaaaaaaaaaaaaaaaa"},
	} {
		answer.Store(tt.body)
		status, out, errs := examCLI(t, e, ts.URL+"/v1", map[string]string{"SANDBOX_EXAM_KEY": key}, strings.Fields(tt.args)...)
		if status != 2 || out != "" {
			t.Errorf("%s: %d %q %q", tt.name, status, out, errs)
		}
		clean(t, tt.name, out+errs)
	}
	// A grade whose now stands: exam gives up by the wall clock.
	answer.Store(strings.NewReplacer(`"state":"graded"`, `"state":"running"`, `"graded_at":"2026-11-22T12:00:30Z","passed":false,"score":"0/1"`, `"graded_at":null,"passed":null,"score":null`,
		`"result":"fail","detail":"ord_`+nasty+`","requests":[2,63]`, `"result":"pending","detail":null,"requests":[]`, `"now":"2026-11-22T12:01:00Z"`, `"now":"2026-11-22T12:00:00Z"`).Replace(graded))
	// Its reads a minute apart by the wall clock, as a machine asleep between them would see:
	// the bound is the wall clock's, not the count of reads.
	clock := &fakeClock{t: testNow}
	var stdout, stderr bytes.Buffer
	getenv := func(k string) string {
		return map[string]string{"SANDBOX_EXAM_BASE_URL": ts.URL + "/v1", "SANDBOX_EXAM_KEY": key}[k]
	}
	sleep := func(ctx context.Context, d time.Duration) error { clock.advance(time.Minute); return ctx.Err() }
	status := runExam(context.Background(), []string{"grade", "exm_aaaaaaaaaaaaaaaaaaaa"}, examDeps{getenv: getenv, stdout: &stdout, stderr: &stderr, sleep: sleep, now: clock.now})
	if waited, errs := clock.now().Sub(testNow), stderr.String(); status != 2 || waited < examPollBound || waited > examPollBound+time.Minute || !strings.Contains(errs, "was not computed in 1h22m0s of polling") {
		t.Errorf("a standing clock: %d after %v: %q", status, waited, errs[max(0, len(errs)-300):])
	}
}

// examRunStandIn is a sandbox's exam routes as exam run meets them: each attempt started is
// graded at once, passed or not as passes says of its number (from 1), with a check whose
// margin is the attempt's number times 100 ms, and, limited, a now past its grading limit (so
// that a client still running is ended at exam run's first look).
type examRunStandIn struct {
	mu       sync.Mutex
	n        int
	variants map[string]int64
	numbers  map[string]int
	passes   func(n int) bool
	limited  bool // its now past the grading limit (else a second past the deadline)
}

func (s *examRunStandIn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if r.Method == http.MethodPost {
		var body struct {
			Variant *int64 `json:"variant"`
		}
		json.NewDecoder(r.Body).Decode(&body)
		s.n++
		id, letter := "exm_"+strings.Repeat("a", 19)+string(rune('a'+s.n)), string(rune('a'+s.n))
		v := int64(100 + s.n)
		if body.Variant != nil {
			v = *body.Variant
		}
		s.variants[id], s.numbers[id] = v, s.n
		w.WriteHeader(201)
		fmt.Fprintf(w, `{"id":%q,"exam":"order-sync","revision":2,"variant":%d,"scale":1,"account":"acct_%s","key":"sk_test_%s","started_at":"2026-11-22T12:00:00Z","deadline":"2026-11-22T12:00:12Z","task":"t","given":{}}`,
			id, v, strings.Repeat(letter, 20), strings.Repeat(letter, 32))
		return
	}
	id := r.PathValue("id")
	n, ok := s.numbers[id]
	if !ok {
		w.WriteHeader(404)
		return
	}
	passed := s.passes(n)
	check := `{"id":"journal.kept_current","result":"pass","detail":null,"requests":[],"margin_ms":%d}`
	score := "2/2"
	if !passed {
		check, score = `{"id":"journal.kept_current","result":"fail","detail":"1 thing the world did was not shown by a read within 3s.","requests":[4],"margin_ms":%d}`, "1/2"
	}
	now := map[bool]string{true: "2026-11-22T12:01:12Z", false: "2026-11-22T12:00:13Z"}[s.limited]
	fmt.Fprintf(w, `{"id":%q,"exam":"order-sync","revision":2,"variant":%d,"scale":1,"account":"acct_x","state":"graded","started_at":"2026-11-22T12:00:00Z","now":%q,"deadline":"2026-11-22T12:00:12Z","graded_at":"2026-11-22T12:00:13Z","passed":%t,"score":%q,"checks":[{"id":"answer.orders","result":"pass","detail":null,"requests":[],"margin_ms":null},`+check+`]}`,
		id, s.variants[id], now, passed, score, map[bool]int{true: 1, false: -1}[passed]*100*n)
}

// TestExamRunClient is the client exam run runs in its tests (this test binary, its argument
// exam-run-client=MODE): it writes its attempt's environment, then passes (exit 0), fails
// (exit 3), or hangs until it is ended (ignoring SIGTERM, when asked). Without the argument it
// is not a test at all.
func TestExamRunClient(t *testing.T) {
	mode, ok := strings.CutPrefix(flag.Arg(0), "exam-run-client=")
	if !ok {
		return
	}
	fmt.Printf("exam %s key %s given %s\n", os.Getenv("SANDBOX_EXAM"), os.Getenv("SANDBOX_KEY")[:8], os.Getenv("SANDBOX_EXAM_GIVEN"))
	fmt.Fprint(os.Stderr, "a line without its end")
	switch mode {
	case "fail":
		os.Exit(3)
	case "hang", "stubborn":
		if mode == "stubborn" {
			signal.Ignore(syscall.SIGTERM)
		}
		time.Sleep(time.Hour)
	}
	os.Exit(0)
}

// TestExamRun: exam run against a client that passes, one that fails, one that fails one
// attempt in two (flaky: pass^k 0.5, 0.167, 0, 0 of four), one that never exits (ended at
// the grading limit: SIGTERM, and SIGKILL when it ignores it) and one that cannot be run,
// in each format, with the exit status; the variants asked for in their order, the client's
// lines prefixed by attempt on standard error, and the report alone on standard output.
func TestExamRun(t *testing.T) {
	t.Parallel()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	run := func(t *testing.T, passes func(int) bool, mode string, args ...string) (int, string, string) {
		t.Helper()
		s := &examRunStandIn{variants: map[string]int64{}, numbers: map[string]int{}, passes: passes, limited: mode == "hang" || mode == "stubborn"}
		mux := http.NewServeMux()
		mux.Handle("POST /v1/test_helpers/exams", s)
		mux.Handle("GET /v1/test_helpers/exams/{id}", s)
		mux.HandleFunc("GET /v1/test_helpers/exams/{id}/trace", func(w http.ResponseWriter, r *http.Request) {
			if mode == "no-trace" || r.Header.Get("Authorization") != "Bearer sk_test_sandbox_all" {
				w.WriteHeader(404)
				return
			}
			fmt.Fprintf(w, `{"log":{"version":"1.2","_exam":{"id":%q},"entries":[]}}`, r.PathValue("id"))
		})
		ts := httptest.NewServer(mux)
		defer ts.Close()
		var stdout, stderr lockedBuffer
		getenv := func(k string) string { return map[string]string{"SANDBOX_EXAM_BASE_URL": ts.URL + "/v1"}[k] }
		command := []string{self, "-test.run=^TestExamRunClient$", "exam-run-client=" + strings.TrimPrefix(mode, "no-trace")}
		if mode == "no-trace" {
			command[2] = "exam-run-client=pass"
		}
		if mode == "missing" {
			command = []string{filepath.Join(t.TempDir(), "no-such-client")}
		}
		status := runExam(context.Background(), append(append(args, "--"), command...), examDeps{getenv: getenv, stdout: &stdout, stderr: &stderr, sleep: sleepFor, now: time.Now})
		return status, stdout.String(), stderr.String()
	}
	always, never := func(int) bool { return true }, func(int) bool { return false }
	t.Run("a client that passes", func(t *testing.T) {
		status, out, errs := run(t, always, "pass", "run", "order-sync", "-attempts", "2")
		want := "exam order-sync revision 2 scale 1: 2 of 2 attempts passed\n  pass^1 1.000  pass^2 1.000\n  PASS  answer.orders: passed 2, failed 0\n  PASS  journal.kept_current: passed 2, failed 0, smallest margin 100 ms\n" +
			"take a failing variant again: exam run order-sync -variant V -- COMMAND\n"
		if status != 0 || out != want {
			t.Errorf("%d\n%s\nwant\n%s", status, out, want)
		}
		for _, line := range []string{"[attempt 1] exam exm_aaaaaaaaaaaaaaaaaaab key sk_test_ given {}\n", "[attempt 1] a line without its end\n", "attempt 1 of 2 exm_aaaaaaaaaaaaaaaaaaab variant 101: passed 2/2 (client exit 0, ", "attempt 2 of 2 exm_aaaaaaaaaaaaaaaaaaac variant 102: passed 2/2"} {
			if !strings.Contains(errs, line) {
				t.Errorf("standard error lacks %q:\n%s", line, errs)
			}
		}
	})
	t.Run("a client that fails, as JSON", func(t *testing.T) {
		status, out, _ := run(t, never, "fail", "run", "order-sync", "-variant", "7", "-variant", "0", "-format", "json")
		want := `{"exam":"order-sync","revision":2,"scale":1,"n":2,"passed":0,"pass_k":[0,0],"checks":[{"id":"answer.orders","state":"pass","passed":2,"failed":0,"min_margin_ms":null,"failed_in":[]},` +
			`{"id":"journal.kept_current","state":"fail","passed":0,"failed":2,"min_margin_ms":-200,"failed_in":[{"id":"exm_aaaaaaaaaaaaaaaaaaab","variant":7,"detail":"1 thing the world did was not shown by a read within 3s."},{"id":"exm_aaaaaaaaaaaaaaaaaaac","variant":0,"detail":"1 thing the world did was not shown by a read within 3s."}]}],` +
			`"attempts":[{"id":"exm_aaaaaaaaaaaaaaaaaaab","variant":7,"passed":false,"score":"1/2","failed":["journal.kept_current"],"exit_code":3,"seconds":SECONDS},{"id":"exm_aaaaaaaaaaaaaaaaaaac","variant":0,"passed":false,"score":"1/2","failed":["journal.kept_current"],"exit_code":3,"seconds":SECONDS}]}` + "\n"
		if got := regexp.MustCompile(`"seconds":[0-9.]+`).ReplaceAllString(out, `"seconds":SECONDS`); status != 1 || got != want {
			t.Errorf("%d\n%s\nwant\n%s", status, got, want)
		}
	})
	t.Run("a flaky client, each format", func(t *testing.T) {
		odd := func(n int) bool { return n%2 == 1 }
		status, out, _ := run(t, odd, "pass", "run", "order-sync", "-attempts", "4", "-format", "json")
		if status != 1 || !strings.Contains(out, `"n":4,"passed":2,"pass_k":[0.5,0.167,0,0]`) || !strings.Contains(out, `{"id":"journal.kept_current","state":"flaky","passed":2,"failed":2,"min_margin_ms":-400,"failed_in":[{"id":"exm_aaaaaaaaaaaaaaaaaaac","variant":102,`) {
			t.Errorf("%d\n%s", status, out)
		}
		status, out, _ = run(t, odd, "pass", "run", "order-sync", "-attempts", "4", "-format", "junit")
		var suite struct {
			Name       string `xml:"name,attr"`
			Failures   int    `xml:"failures,attr"`
			Properties []struct {
				Name  string `xml:"name,attr"`
				Value string `xml:"value,attr"`
			} `xml:"properties>property"`
			Cases []struct {
				Name    string `xml:"name,attr"`
				Class   string `xml:"classname,attr"`
				Failure *struct {
					Message string `xml:"message,attr"`
					Text    string `xml:",chardata"`
				} `xml:"failure"`
			} `xml:"testcase"`
		}
		if err := xml.Unmarshal([]byte(out), &suite); status != 1 || err != nil || suite.Name != "exam order-sync rev 2 x 4" || suite.Failures != 1 || len(suite.Cases) != 2 || len(suite.Properties) != 8 ||
			suite.Properties[1].Name+"="+suite.Properties[1].Value != "pass^2=0.167" || suite.Properties[4].Name+"="+suite.Properties[4].Value != "attempt.1=101" ||
			suite.Cases[1].Class != "exam.order-sync" || suite.Cases[1].Failure == nil || suite.Cases[1].Failure.Message != "failed in 2 of 4 attempts" ||
			suite.Cases[1].Failure.Text != "exm_aaaaaaaaaaaaaaaaaaac variant 102: 1 thing the world did was not shown by a read within 3s.\nexm_aaaaaaaaaaaaaaaaaaae variant 104: 1 thing the world did was not shown by a read within 3s." {
			t.Errorf("%d %v %+v\n%s", status, err, suite, out)
		}
		status, out, _ = run(t, odd, "pass", "run", "order-sync", "-attempts", "4")
		_, shown := examsPageBlock(t, "exam run order-sync -attempts 4")
		if out = examIDs.ReplaceAllString(out, "exm_ID"); status != 1 || out != shown+"\n" {
			t.Errorf("%d\n%s\nthe page shows:\n%s", status, out, shown)
		}
	})
	t.Run("-trace-dir: each attempt's trace kept as DIR/ID.har", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "traces", "made")
		status, _, errs := run(t, always, "pass", "run", "order-sync", "-attempts", "2", "-trace-dir", dir)
		if status != 0 {
			t.Errorf("%d %s", status, errs)
		}
		names, _ := os.ReadDir(dir)
		if len(names) != 2 {
			t.Fatalf("%v", names)
		}
		for _, id := range []string{"exm_aaaaaaaaaaaaaaaaaaab", "exm_aaaaaaaaaaaaaaaaaaac"} {
			b, err := os.ReadFile(filepath.Join(dir, id+".har"))
			if want := fmt.Sprintf(`{"log":{"version":"1.2","_exam":{"id":%q},"entries":[]}}`, id); err != nil || string(b) != want {
				t.Errorf("%s: %v %s", id, err, b)
			}
			if fi, err := os.Stat(filepath.Join(dir, id+".har")); err != nil || fi.Mode().Perm() != 0o644 {
				t.Errorf("%s: %v %v", id, err, fi.Mode())
			}
		}
		status, out, errs := run(t, always, "no-trace", "run", "order-sync", "-attempts", "1", "-trace-dir", t.TempDir())
		if status != 2 || !strings.Contains(errs, "sandbox exam: attempt exm_aaaaaaaaaaaaaaaaaaab: its trace could not be written: GET ") || !strings.Contains(out, "1 of 1 attempts passed") {
			t.Errorf("a trace not read: %d\n%s\n%s", status, out, errs)
		}
		if status, _, errs := run(t, always, "pass", "grade", "exm_aaaaaaaaaaaaaaaaaaab", "-trace-dir", dir); status != 2 || !strings.Contains(errs, "-trace-dir is exam run's") {
			t.Errorf("%d %s", status, errs)
		}
	})
	t.Run("a client that never exits", func(t *testing.T) {
		for _, mode := range []string{"hang", "stubborn"} {
			began := time.Now()
			status, out, errs := run(t, always, mode, "run", "order-sync", "-attempts", "1", "-format", "json")
			if status != 0 || !strings.Contains(out, `"exit_code":null`) || !strings.Contains(errs, "reached its grading limit (1m0s after its deadline) with its client still running: ending it (SIGTERM, then SIGKILL 5s later)") ||
				!strings.Contains(errs, "attempt 1 of 1 exm_aaaaaaaaaaaaaaaaaaab variant 101: passed 2/2 (client ended at its limit, ") {
				t.Errorf("%s: %d\n%s\n%s", mode, status, out, errs)
			}
			if took := time.Since(began); mode == "stubborn" && took < examKillGrace {
				t.Errorf("a client that ignores SIGTERM was ended after %v, before its %v", took, examKillGrace)
			}
		}
	})
	t.Run("a client that cannot be run", func(t *testing.T) {
		for _, format := range []string{"text", "json", "junit"} {
			status, out, errs := run(t, always, "missing", "run", "order-sync", "-attempts", "2", "-format", format)
			if status != 2 || !strings.Contains(errs, "attempt 1 of 2 exm_aaaaaaaaaaaaaaaaaaab variant 101: its command could not be run: fork/exec ") || !strings.Contains(out, "attempt 2: its command could not be run") {
				t.Errorf("%s: %d\n%s\n%s", format, status, out, errs)
			}
			if format == "junit" && !strings.Contains(out, `errors="2"`) {
				t.Errorf("the JUnit report counts no error: %s", out)
			}
		}
	})
}

// BenchmarkExamRun: exam run's own cost per attempt, beyond its client's and its grade's
// time: a stand-in grades each attempt at once and the client is true(1), so what is left is
// the start, the client's process started and waited for, the grade read and the report (the
// contract's bound: 100 ms).
func BenchmarkExamRun(b *testing.B) {
	client, err := exec.LookPath("true")
	if err != nil {
		b.Skip("no true(1)")
	}
	s := &examRunStandIn{variants: map[string]int64{}, numbers: map[string]int{}, passes: func(int) bool { return true }}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/test_helpers/exams", s)
	mux.Handle("GET /v1/test_helpers/exams/{id}", s)
	ts := httptest.NewServer(mux)
	defer ts.Close()
	getenv := func(k string) string { return map[string]string{"SANDBOX_EXAM_BASE_URL": ts.URL + "/v1"}[k] }
	b.ReportAllocs()
	for b.Loop() {
		s.mu.Lock()
		s.n = 0 // the stand-in's ids run to z: start again
		s.mu.Unlock()
		var out, errs bytes.Buffer
		if status := runExam(context.Background(), []string{"run", "order-sync", "-attempts", "1", "-format", "json", "--", client}, examDeps{getenv: getenv, stdout: &out, stderr: &errs, sleep: sleepFor, now: time.Now}); status != 0 {
			b.Fatalf("%d %s %s", status, out.String(), errs.String())
		}
	}
}

// TestExamTrace: an attempt's trace holds every entry of its journal with its _ members, the
// body each write read and the text of each answer (a read's rendered again byte for byte, a
// sandbox's keys masked), in HAR 1.2's order; it is 404 for another key and 422 for a query;
// exam regrade judges it again to its grade (exit 0), names each check a trace changed
// otherwise (exit 1: an entry removed, a write added, the answer changed) and refuses what
// is no graded trace (exit 2); a body past an attempt's 16 MiB is lost, and said so.
func TestExamTrace(t *testing.T) {
	t.Parallel()
	type sent struct {
		method, route string
		rep           reply
	}
	c := takeExam(t, envOptions{}, `{"exam":"booking"}`)
	ts := httptest.NewServer(c.e.h)
	defer ts.Close()
	var log []sent
	do := func(r *http.Request, route string) reply {
		rep := c.e.do(t, r)
		log = append(log, sent{r.Method, route, rep})
		return rep
	}
	get := func(target, route string, pairs ...string) reply {
		return do(newRequest(http.MethodGet, target, c.x.Key, pairs...), route)
	}
	post := func(target, route, body, idem string) reply {
		return do(newBodyRequest(http.MethodPost, target, c.x.Key, body, "Content-Type", "application/json", "Idempotency-Key", idem), route)
	}
	get("/v1/test_helpers/clock", "/v1/test_helpers/clock")
	page := decodePage(t, get("/v1/orders?limit=2", "/v1/orders"))
	get("/v1/orders?limit=2&cursor="+url.QueryEscape(*page.Pagination.NextCursor), "/v1/orders")
	var shipped []string
	for _, o := range decodePage(t, get("/v1/orders?status=fulfilled", "/v1/orders")).Data {
		if o.ShipmentID != nil {
			continue
		}
		body, idem := fmt.Sprintf(`{"reference":"T-%s","order_id":%q}`, o.MerchantReference, o.ID), c.newKey()
		rep := post("/v1/test_helpers/shipments", "/v1/test_helpers/shipments", body, idem)
		if rep.status == 502 {
			rep = post("/v1/test_helpers/shipments", "/v1/test_helpers/shipments", body, idem)
		}
		var made struct {
			ID string `json:"shipment_id"`
		}
		if json.Unmarshal(rep.body, &made) == nil && made.ID != "" {
			shipped = append(shipped, made.ID)
		}
		c.sleep(300 * time.Millisecond)
	}
	if len(shipped) == 0 {
		t.Fatal("nothing booked")
	}
	get("/v1/shipments/"+shipped[0]+"/tracking", "/v1/shipments/{id}/tracking")
	var spare struct {
		ID string `json:"shipment_id"`
	}
	mustDecode(t, post("/v1/test_helpers/shipments", "/v1/test_helpers/shipments", fmt.Sprintf(`{"reference":%q}`, c.x.Key), c.newKey()).body, &spare) // a key where none belongs: masked in the trace
	shipped = append(shipped, spare.ID)
	get("/v1/orders/"+c.x.Key, "/v1/orders/{id}")
	do(newBodyRequest(http.MethodPost, "/v1/test_helpers/clock", c.x.Key, `{"advance":"1s"}`, "Content-Type", "application/json"), "/v1/test_helpers/clock") // a body read on no write: kept (its 422: an exam's clock is its own)
	for range 2 {                                                                                                                                            // answered 502 as asked before its body is read, then sent again: no body, and no blind retry
		do(newBodyRequest(http.MethodPost, "/v1/test_helpers/clock", c.x.Key, `{"advance":"1s"}`, "Content-Type", "application/json", "Prefer", "code=502"), "/v1/test_helpers/clock")
	}
	get("/v1/tracking/EXB-NOWHERE", "/v1/tracking/{tracking_number}")
	get("/v1/orders", "/v1/orders", "Prefer", "code=503")
	do(newRequest(http.MethodHead, "/v1/orders", c.x.Key), "/v1/orders")
	c.sleep(time.Second)
	made := post("/v1/test_helpers/sandboxes", "/v1/test_helpers/sandboxes", `{"template":"acct_sync"}`, c.newKey())
	var sandbox sandboxAnswer
	mustDecode(t, made.body, &sandbox)
	post("/v1/test_helpers/shipments", "/v1/test_helpers/shipments", "\xff\xfe not UTF-8", c.newKey())
	running := c.e.get(t, "/v1/test_helpers/exams/"+c.x.ID+"/trace", c.x.Key, "Prefer", "code=503")
	g := c.grade(t)
	trace := traceRegrades(t, c, g)

	t.Run("every entry, its members in HAR's order, then the journal's", func(t *testing.T) {
		raw := string(trace)
		if !(strings.HasPrefix(raw, `{"log":{"version":"1.2","creator":{"name":"shipping-api-sandbox","version":"v1"},"_exam":{"id":"`+c.x.ID+`","exam":"booking","revision":2,"variant":0,"scale":1,"account":"`+c.x.Account+`","started_at":"`) &&
			strings.Contains(raw, `,"answer":null,"lost":0,"passed":`) && strings.Index(raw, `"_exam"`) < strings.Index(raw, `"entries"`)) {
			t.Errorf("the log's head: %.600s", raw)
		}
		var tr struct {
			Log struct {
				Entries []json.RawMessage `json:"entries"`
			} `json:"log"`
		}
		mustDecode(t, trace, &tr)
		if len(tr.Log.Entries) != len(log) {
			t.Fatalf("%d entries, want %d", len(tr.Log.Entries), len(log))
		}
		for i, raw := range tr.Log.Entries {
			want := []string{"startedDateTime", "time", "request", "response", "cache", "timings", "_seq", "_clock", "_route", "_key", "_code", "_simulated", "_run", "_ids", "_writes", "_written"}
			if got := objectKeys(t, raw); !slices.Equal(got, want) {
				t.Errorf("entry %d's members: %v", i+1, got)
			}
			var e struct {
				StartedDateTime string `json:"startedDateTime"`
				Request         struct {
					Method   string    `json:"method"`
					Headers  []harPair `json:"headers"`
					PostData *struct {
						MimeType string `json:"mimeType"`
						Text     string `json:"text"`
						Encoding string `json:"_encoding"`
					} `json:"postData"`
				} `json:"request"`
				Response struct {
					Status  int `json:"status"`
					Content struct {
						Size    int64   `json:"size"`
						Text    *string `json:"text"`
						Comment string  `json:"comment"`
					} `json:"content"`
				} `json:"response"`
				Seq     uint64  `json:"_seq"`
				Route   string  `json:"_route"`
				Key     string  `json:"_key"`
				Written *string `json:"_written"`
			}
			mustDecode(t, raw, &e)
			s := log[i]
			if e.Seq != uint64(i+1) || e.Request.Method != s.method || e.Route != s.route || e.Response.Status != s.rep.status || e.Key != keyMask(c.x.Key) ||
				!regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z$`).MatchString(e.StartedDateTime) {
				t.Errorf("entry %d: %s", i+1, raw)
			}
			text := ""
			if e.Response.Content.Text != nil {
				text = *e.Response.Content.Text
			}
			switch {
			case s.method == http.MethodHead:
				if e.Response.Content.Text != nil {
					t.Errorf("entry %d, a HEAD, has a text", i+1)
				}
			case s.route == "/v1/test_helpers/sandboxes":
				if text != string(maskedKeys(s.rep.body)) || strings.Contains(text, sandbox.Keys[0].Key) || !strings.Contains(text, keyMask(sandbox.Keys[0].Key)) || e.Written == nil || *e.Written != sandbox.Account {
					t.Errorf("the sandbox's 201: %s", raw)
				}
			case text != string(maskedSecrets(s.rep.body)) || e.Response.Content.Size != int64(len(s.rep.body)):
				t.Errorf("entry %d's text:\n%s\nsent:\n%s", i+1, text, s.rep.body)
			}
			switch {
			case s.method == http.MethodPost && s.rep.status == 502 && s.route == "/v1/test_helpers/clock":
				if e.Request.PostData != nil {
					t.Errorf("entry %d, answered before its body was read, has a postData", i+1)
				}
			case s.method == http.MethodPost && e.Request.PostData == nil:
				t.Errorf("entry %d, a body read, has no postData", i+1)
			case s.method != http.MethodPost && e.Request.PostData != nil:
				t.Errorf("entry %d, a read, has a postData", i+1)
			case e.Request.PostData != nil && strings.HasPrefix(e.Request.PostData.Text, "//7+"):
				if e.Request.PostData.Encoding != "base64" {
					t.Errorf("a body not UTF-8: %s", raw)
				}
			}
			written := ""
			if e.Written != nil {
				written = *e.Written
			}
			if s.route == "/v1/test_helpers/shipments" && s.rep.status == 201 && written != "" && !slices.Contains(shipped, written) {
				t.Errorf("entry %d wrote %s", i+1, written)
			}
			if s.rep.status == 201 && s.route == "/v1/test_helpers/shipments" && written == "" && !(i > 0 && log[i-1].rep.status == 502) {
				t.Errorf("entry %d, a 201 of its own, names no shipment written", i+1)
			}
		}
		for _, k := range []string{c.x.Key, sandbox.Keys[0].Key} {
			if strings.Contains(raw, k) {
				t.Errorf("a key unmasked in the trace")
			}
		}
	})
	t.Run("the route: a running attempt's, another key's, a query", func(t *testing.T) {
		if running.status != 200 || !strings.Contains(string(running.body), `"graded_at":null,"answer":null,"lost":0,"passed":null,"score":null`) || running.header.Get("Preference-Applied") != "" {
			t.Errorf("a running attempt's trace: %d %.300s", running.status, running.body)
		}
		if rep := c.e.get(t, "/v1/test_helpers/exams/"+c.x.ID+"/trace", "sk_test_other_all"); rep.status != 404 || rep.problem(t).Code != "not_found" {
			t.Errorf("another key: %s", rep)
		}
		if rep := c.e.get(t, "/v1/test_helpers/exams/"+c.x.ID+"/trace?format=har", c.maker); rep.status != 422 || rep.problem(t).Code != "unknown_parameter" || rep.problem(t).paramName() != "format" {
			t.Errorf("a query: %s", rep)
		}
		before := c.e.srv.registry.named[c.x.ID].journalPart(journalRead{}).last
		c.e.get(t, "/v1/test_helpers/exams/"+c.x.ID+"/trace", c.x.Key)
		if after := c.e.srv.registry.named[c.x.ID].journalPart(journalRead{}).last; after != before {
			t.Errorf("a trace's read was journaled")
		}
	})
	dir := t.TempDir()
	file := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	edits := 0
	edited := func(t *testing.T, tr []byte, edit func(log map[string]any)) string {
		d := json.NewDecoder(bytes.NewReader(tr))
		d.UseNumber()
		var v map[string]any
		if err := d.Decode(&v); err != nil {
			t.Fatal(err)
		}
		edit(v["log"].(map[string]any))
		b, _ := json.Marshal(v)
		edits++
		return file(fmt.Sprintf("edited-%d.har", edits), b)
	}
	base := ts.URL + "/v1"
	t.Run("regrade: the grade recorded, exit 0", func(t *testing.T) {
		status, out, errs := examCLI(t, c.e, base, nil, "regrade", file("booking.har", trace))
		if status != 0 || errs != "" || !strings.HasPrefix(out, "exam booking "+c.x.ID+" (revision 2, variant 0, scale 1): FAILED, 8/10\n  FAIL  state.booked: 2 orders fulfilled at the deadline have no shipment") {
			t.Errorf("%d %q\n%s", status, errs, out)
		}
		status, out, _ = examCLI(t, c.e, base, nil, "regrade", "-format", "junit", file("booking.har", trace))
		if status != 0 || !strings.Contains(out, `<testsuite name="exam booking `+c.x.ID+`"`) {
			t.Errorf("%d %s", status, out)
		}
		if status, _, errs := examCLI(t, c.e, base, nil, "regrade", "-revision", "2", file("booking.har", trace)); status != 0 || errs != "" {
			t.Errorf("-revision 2: %d %s", status, errs)
		}
	})
	t.Run("regrade: an entry removed, exit 1 naming the checks", func(t *testing.T) {
		p := edited(t, trace, func(log map[string]any) {
			es := log["entries"].([]any)
			for i, e := range es {
				if e.(map[string]any)["_written"] != nil {
					log["entries"] = slices.Delete(es, i, i+1)
					return
				}
			}
		})
		status, _, errs := examCLI(t, c.e, base, nil, "regrade", p)
		if status != 1 || !strings.Contains(errs, "sandbox exam: differs: state.booked: recorded fail, regraded fail: 3 orders fulfilled at the deadline have no shipment") || !strings.Contains(errs, "sandbox exam: differs: findings.stale_order: recorded fail, regraded pass") {
			t.Errorf("%d %s", status, errs)
		}
	})
	sync := takeExam(t, envOptions{}, `{"exam":"order-sync","variant":3}`)
	sync.get(t, "/v1/test_helpers/clock")
	syncOrders(time.Second, 0, 12*time.Second, false)(t, sync)
	syncTrace := traceRegrades(t, sync, sync.grade(t))
	t.Run("regrade: a write added, exit 1 naming journal.read_only", func(t *testing.T) {
		p := edited(t, syncTrace, func(log map[string]any) {
			es := log["entries"].([]any)
			last := es[len(es)-1].(map[string]any)
			w := map[string]any{}
			for k, v := range last {
				w[k] = v
			}
			req := map[string]any{}
			for k, v := range last["request"].(map[string]any) {
				req[k] = v
			}
			req["method"], req["url"] = "POST", strings.Replace(req["url"].(string), "/v1/orders", "/v1/test_helpers/shipments", 1)
			req["postData"] = map[string]any{"mimeType": "application/json", "text": `{"reference":"ADDED"}`}
			req["headers"] = append(req["headers"].([]any), map[string]any{"name": "Idempotency-Key", "value": "added"})
			resp := map[string]any{}
			for k, v := range last["response"].(map[string]any) {
				resp[k] = v
			}
			resp["status"] = 201
			w["request"], w["response"], w["_route"], w["_written"], w["_ids"] = req, resp, "/v1/test_helpers/shipments", "shp_added", []any{"shp_added"}
			w["_seq"] = json.Number(fmt.Sprint(len(es) + 1000))
			log["entries"] = append(es, w)
		})
		status, _, errs := examCLI(t, c.e, base, nil, "regrade", p)
		if status != 1 || !strings.Contains(errs, "sandbox exam: differs: journal.read_only: recorded pass, regraded fail: 1 write was done with the attempt's key") {
			t.Errorf("%d %s", status, errs)
		}
	})
	t.Run("regrade: the answer changed, exit 1 naming answer.orders", func(t *testing.T) {
		p := edited(t, syncTrace, func(log map[string]any) {
			ex := log["_exam"].(map[string]any)
			ans := ex["answer"].(map[string]any)
			ans["orders"] = ans["orders"].([]any)[1:]
		})
		status, _, errs := examCLI(t, c.e, base, nil, "regrade", p)
		if status != 1 || !strings.Contains(errs, "sandbox exam: differs: passed: recorded true, regraded false") || !strings.Contains(errs, "sandbox exam: differs: answer.orders: recorded pass, regraded fail: The answer lacks 1 order") {
			t.Errorf("%d %s", status, errs)
		}
	})
	t.Run("regrade: no graded trace, exit 2 saying why", func(t *testing.T) {
		strip := func(member string) func(log map[string]any) {
			return func(log map[string]any) { delete(log["entries"].([]any)[2].(map[string]any), member) }
		}
		for _, tc := range []struct {
			path, want string
			args       []string
		}{
			{file("not.json", []byte("{")), "not JSON", nil},
			{file("no-exam.har", []byte(`{"log":{"version":"1.2","entries":[]}}`)), "no log._exam", nil},
			{file("old.har", []byte(`{"log":{"version":"1.1","entries":[]}}`)), "not HAR 1.2", nil},
			{file("running.har", running.body), "graded_at is null", nil},
			{edited(t, trace, strip("_clock")), "entry 3 lacks the _ members of a trace", nil},
			{edited(t, trace, func(log map[string]any) { log["entries"].([]any)[3].(map[string]any)["_seq"] = json.Number("1") }), "entry 4: _seq 1 does not follow 3", nil},
			{edited(t, trace, func(log map[string]any) { log["entries"].([]any)[3].(map[string]any)["_body"] = "lost" }), "its write's body was not kept", nil},
			{edited(t, trace, func(log map[string]any) { log["_exam"].(map[string]any)["exam"] = "nope" }), `exam "nope" is not one this binary holds`, nil},
			{edited(t, trace, func(log map[string]any) { log["_exam"].(map[string]any)["revision"] = 1 }), "revision 1 of booking is not one this binary holds (it holds 2): judge it by that one with -revision 2", nil},
			{file("booking.har", trace), "-revision 1: this binary holds revision 2 of booking", []string{"-revision", "1"}},
		} {
			status, out, errs := examCLI(t, c.e, base, nil, append(append([]string{"regrade"}, tc.args...), tc.path)...)
			if status != 2 || out != "" || !strings.Contains(errs, tc.want) {
				t.Errorf("%s: %d %q %q", tc.want, status, out, errs)
			}
		}
		p := edited(t, trace, func(log map[string]any) { log["_exam"].(map[string]any)["revision"] = 1 })
		if status, _, errs := examCLI(t, c.e, base, nil, "regrade", "-revision", "2", p); status != 0 {
			t.Errorf("an older revision judged by revision 2: %d %s", status, errs)
		}
	})
	t.Run("a body past the attempt's 16 MiB is lost, and regrade refuses the trace", func(t *testing.T) {
		c := takeExam(t, envOptions{unchecked: true}, `{"exam":"tracking"}`) // 65 answers of 400 to bodies of 256 KiB, checked elsewhere; the trace's 16 MiB read once
		body := strings.Repeat("x", maxBodyBytes-1)
		n := maxTracedBodies/len(body) + 1
		for i := range n {
			if i%9 == 8 {
				c.wait(time.Second)
			}
			if rep := c.post(t, "/v1/test_helpers/shipments", body, c.newKey()); rep.status != 400 {
				t.Fatalf("write %d: %s", i, rep)
			}
		}
		c.wait(time.Second)
		c.grade(t)
		rep := c.e.get(t, "/v1/test_helpers/exams/"+c.x.ID+"/trace", c.maker)
		var tr struct {
			Log struct {
				Entries []struct {
					Request struct {
						PostData *struct{ Text string } `json:"postData"`
					} `json:"request"`
					Body string `json:"_body"`
				} `json:"entries"`
			} `json:"log"`
		}
		mustDecode(t, rep.body, &tr)
		es := tr.Log.Entries
		if len(es) != n || es[n-2].Request.PostData == nil || es[n-2].Request.PostData.Text != body || es[n-1].Body != "lost" || es[n-1].Request.PostData != nil {
			t.Fatalf("%d entries; the last two: %+v", len(es), es[max(0, len(es)-2):])
		}
		status, _, errs := examCLI(t, c.e, base, nil, "regrade", file("lost.har", rep.body))
		if status != 2 || !strings.Contains(errs, fmt.Sprintf("entry %d (_seq %d): its write's body was not kept", n, n)) {
			t.Errorf("%d %s", status, errs)
		}
	})
}

// objectKeys are the members of the JSON object raw, in their order.
func objectKeys(t testing.TB, raw []byte) []string {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := d.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("not an object: %s", raw)
	}
	var keys []string
	for d.More() {
		tok, err := d.Token()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, tok.(string))
		var v json.RawMessage
		if err := d.Decode(&v); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

// TestExamLint: exam lint on a HAR as a browser's network panel saves it (no _ members, a key
// in some Authorization fields, none in others): retry_too_soon and blind_retry found, a
// cursor sent with other filters, a walk left unfinished, a write when asked to read only, a
// key past 10 requests a second and one sent on after its 401 each fail, citing entries by
// their place; the world's checks skipped; another host's entry and an unreadable one
// counted; no key and no control character of the file written; exit 1; a clean HAR exit 0;
// one that is no HAR exit 2.
func TestExamLint(t *testing.T) {
	t.Parallel()
	const key = "sk_test_secretsecretsecret"
	at := func(ms int) string {
		return testNow.Add(time.Duration(ms) * time.Millisecond).UTC().Format("2006-01-02T15:04:05.000Z")
	}
	entry := func(ms int, method, url string, headers map[string]string, body string, status int, respHeaders map[string]string, text string) map[string]any {
		var hs, rhs []map[string]string
		for k, v := range headers {
			hs = append(hs, map[string]string{"name": k, "value": v})
		}
		for k, v := range respHeaders {
			rhs = append(rhs, map[string]string{"name": k, "value": v})
		}
		req := map[string]any{"method": method, "url": url, "headers": hs}
		if body != "" {
			req["postData"] = map[string]any{"mimeType": "application/json", "text": body}
		}
		resp := map[string]any{"status": status, "headers": rhs, "content": map[string]any{"size": len(text), "mimeType": "application/json", "text": text}}
		return map[string]any{"startedDateTime": at(ms), "time": 10, "request": req, "response": resp}
	}
	auth := map[string]string{"Authorization": "Bearer " + key}
	b := "http://127.0.0.1:8080"
	entries := []map[string]any{
		entry(0, "GET", b+"/v1/orders?status=fulfilled", auth, "", 200, nil, `{"data":[],"pagination":{"limit":20,"next_cursor":"C1","has_more":true}}`),                     // 1
		entry(100, "GET", b+"/v1/orders?cursor=C1", auth, "", 200, nil, `{"data":[],"pagination":{"limit":20,"next_cursor":null,"has_more":false}}`),                         // 2: the filter dropped
		entry(200, "GET", b+"/v1/orders?limit=1", nil, "", 200, nil, `{"data":[],"pagination":{"limit":1,"next_cursor":"C2","has_more":true}}`),                              // 3: never walked on
		entry(300, "GET", b+"/v1/orders/ord_1", auth, "", 429, map[string]string{"Retry-After": "1"}, `{}`),                                                                  // 4
		entry(500, "GET", b+"/v1/orders/ord_1", auth, "", 200, nil, `{}`),                                                                                                    // 5: too soon
		entry(600, "POST", b+"/v1/test_helpers/shipments", map[string]string{"Authorization": "Bearer " + key, "Idempotency-Key": "a"}, `{"reference":"R"}`, 502, nil, `{}`), // 6
		entry(700, "POST", b+"/v1/test_helpers/shipments", map[string]string{"Authorization": "Bearer " + key, "Idempotency-Key": "b"}, `{"reference":"R"}`, 201, nil, `{}`), // 7: blind
		entry(800, "GET", "https://elsewhere.example/\u001b[2J", auth, "", 200, nil, ""),                                                                                     // 8: another host
		{"request": map[string]any{"method": "GET"}}, // 9: unreadable
		entry(900, "GET", b+"/v1/orders", map[string]string{"Authorization": "Bearer sk_test_revoked\u001b]0;x\u0007"}, "", 401, nil, `{}`), // 10
		entry(950, "GET", b+"/v1/orders", map[string]string{"Authorization": "Bearer sk_test_revoked\u001b]0;x\u0007"}, "", 401, nil, `{}`), // 11: after its 401
	}
	for i := range 11 { // 12..22: eleven within a second
		entries = append(entries, entry(2000+50*i, "GET", b+"/v1/orders/ord_2", auth, "", 200, nil, `{}`))
	}
	file := filepath.Join(t.TempDir(), "browser.har")
	raw, _ := json.Marshal(map[string]any{"log": map[string]any{"version": "1.2", "creator": map[string]string{"name": "WebInspector", "version": "537.36"}, "entries": entries}})
	os.WriteFile(file, raw, 0o644)
	e := newEnv(t, envOptions{quiet: true, step: -1})
	lint := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		status := runExam(context.Background(), append([]string{"lint"}, args...), examDeps{getenv: func(k string) string { return map[string]string{"SANDBOX_EXAM_KEY": key}[k] }, stdout: &stdout, stderr: &stderr, sleep: sleepFor, now: e.clock.now})
		return status, stdout.String(), stderr.String()
	}
	status, out, errs := lint(file, "-read-only")
	want := `FAIL findings.retry_too_soon: 1 request was sent again before the Retry-After of an earlier answer to them had passed: wait at least the Retry-After seconds (429, 503) before sending a request again. (entries 4, 5)
FAIL findings.blind_retry: POST /v1/test_helpers/shipments was answered 502 (entry 6), and the same write was sent again under another Idempotency-Key (entry 7): retry a 502 with the same Idempotency-Key, which answers the first write's result. (entries 6, 7)
FAIL lint.cursor_filters: Entry 2 sent the cursor of entry 1's page with other filters ("", not "status=fulfilled"): keep the same filters between pages. (entries 1, 2)
FAIL lint.walk_complete: 1 page had more (has_more true) whose next_cursor was never sent: read every page to its end. (entries 3)
FAIL lint.read_only: 2 writes were done (2xx, or a 502 that may have been): the client was to only read. (entries 6, 7)
FAIL lint.polling_rate: 1 key sent over 10 requests within one second: poll no faster than the limit (the exam key's: 10 a second), and wait a 429's Retry-After. (entries 12, 22)
FAIL lint.auth_loop: 1 request was sent again after a 401 to its key (or a 403 to its method and path): a key refused stays refused; fix the key or its scopes, do not retry. (entries 10, 11)
`
	for _, id := range lintWorldChecks {
		want += "skip " + id + ": needs the world\n"
	}
	want += "lint: 20 entries judged, 1 other hosts, 1 unreadable, 7 failing\n"
	if status != 1 || out != want || errs != "" {
		t.Errorf("%d %q\n%s\nwant\n%s", status, errs, out, want)
	}
	for _, format := range []string{"text", "json", "junit"} {
		status, out, _ := lint(file, "-format", format)
		if status != 1 || strings.Contains(out, "secretsecret") || strings.ContainsAny(out, "\x1b\x07") {
			t.Errorf("%s: %d, a key or a control character written:\n%s", format, status, out)
		}
		if format == "json" && !strings.HasPrefix(out, `{"file":"`+file+`","base_url":"http://127.0.0.1:8080","entries":22,"judged":20,"other_hosts":1,"unreadable":1,"keys":3,"checks":[{"id":"findings.retry_too_soon","result":"fail",`) {
			t.Errorf("the JSON report: %s", out)
		}
		if format == "junit" && (xml.Unmarshal([]byte(out), new(struct{})) != nil || strings.Count(out, "<skipped") != len(lintWorldChecks)+1) { // the world's, and read_only not asked
			t.Errorf("the JUnit report: %s", out)
		}
	}
	clean := filepath.Join(t.TempDir(), "clean.har")
	raw, _ = json.Marshal(map[string]any{"log": map[string]any{"version": "1.2", "entries": entries[:1:1]}})
	os.WriteFile(clean, raw, 0o644)
	if status, out, _ := lint(clean); status != 1 || !strings.Contains(out, "FAIL lint.walk_complete") {
		t.Errorf("one page never walked on: %d\n%s", status, out)
	}
	raw, _ = json.Marshal(map[string]any{"log": map[string]any{"version": "1.2", "entries": entries[3:4:4]}})
	os.WriteFile(clean, raw, 0o644)
	if status, out, _ := lint(clean); status != 0 || !strings.Contains(out, "skip lint.cursor_filters: needs response bodies") || !strings.Contains(out, "lint: 1 entries judged") {
		t.Errorf("a clean HAR: %d\n%s", status, out)
	}
	for _, bad := range []string{"\x1b[2J" + key, `{"log":{}}`, `[]`} {
		os.WriteFile(clean, []byte(bad), 0o644)
		if status, out, errs := lint(clean); status != 2 || out != "" || strings.Contains(errs, "secretsecret") || !strings.Contains(errs, "not a HAR file") {
			t.Errorf("%q: %d %q %q", bad, status, out, errs)
		}
	}
}

// BenchmarkExamLint: exam lint on a HAR of 20,000 entries, pages and retries among them (the
// contract's bound: 1 s).
func BenchmarkExamLint(b *testing.B) {
	var entries []map[string]any
	for i := range 20000 {
		status, headers := 200, []map[string]string{}
		if i%5 == 0 {
			status, headers = 429, []map[string]string{{"name": "Retry-After", "value": "1"}}
		}
		entries = append(entries, map[string]any{"startedDateTime": testNow.Add(time.Duration(i) * 30 * time.Millisecond).Format(time.RFC3339Nano), "time": 5,
			"request":  map[string]any{"method": "GET", "url": fmt.Sprintf("http://127.0.0.1:8080/v1/orders?limit=100&cursor=C%d", i%100), "headers": []map[string]string{{"name": "Authorization", "value": "Bearer k"}}},
			"response": map[string]any{"status": status, "headers": headers, "content": map[string]any{"text": fmt.Sprintf(`{"data":[],"pagination":{"limit":100,"next_cursor":"C%d","has_more":true}}`, (i+1)%100)}}})
	}
	raw, _ := json.Marshal(map[string]any{"log": map[string]any{"version": "1.2", "entries": entries}})
	file := filepath.Join(b.TempDir(), "big.har")
	os.WriteFile(file, raw, 0o644)
	b.ReportAllocs()
	for b.Loop() {
		var stdout, stderr bytes.Buffer
		if status := runExam(context.Background(), []string{"lint", file, "-format", "json"}, examDeps{getenv: func(string) string { return "" }, stdout: &stdout, stderr: &stderr, sleep: sleepFor, now: time.Now}); status == 2 {
			b.Fatal(stderr.String())
		}
	}
}

// examsPage is docs/exams.md, and its blocks of a kind ("sh", "go", "text") in order.
func examsPage(t *testing.T, kind string) []string {
	t.Helper()
	page, err := os.ReadFile("docs/exams.md")
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	for _, m := range regexp.MustCompile("(?s)```"+kind+"\n(.*?)```").FindAllStringSubmatch(string(page), -1) {
		blocks = append(blocks, m[1])
	}
	return blocks
}

// examsPageBlock is the page's sh block that holds marker, and the text block shown under it.
func examsPageBlock(t *testing.T, marker string) (block, shown string) {
	t.Helper()
	page, _ := os.ReadFile("docs/exams.md")
	for _, b := range shellBlocks(string(page)) {
		if strings.Contains(b[1], marker) {
			return b[1], b[2]
		}
	}
	t.Fatalf("docs/exams.md has no shell block with %q", marker)
	return "", ""
}

var examIDs = regexp.MustCompile(`exm_[a-z2-7]{20}`)

// TestExamsPageCILines: docs/exams.md's CI lines, run as written in one shell, with the
// sandbox command on the PATH (the binary go build makes) and the page's reference client of
// order-sync saved as my-sync/main.go in a module of its own, against a sandbox whose clock is
// the wall clock: the client passes, exam grade prints the grade the page shows and exits 0.
func TestExamsPageCILines(t *testing.T) {
	t.Parallel()
	needTools(t, "bash", "go")
	bin, err := sandboxBinary()
	if err != nil {
		t.Fatal(err)
	}
	client := examsPage(t, "go")
	if len(client) != 1 || !strings.HasPrefix(client[0], "// my-sync keeps a copy") {
		t.Fatalf("docs/exams.md's Go blocks: %d, want the reference client", len(client))
	}
	dir, path := t.TempDir(), t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "my-sync"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "my-sync", "main.go"), []byte(client[0]), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(bin, filepath.Join(path, "sandbox")); err != nil {
		t.Fatal(err)
	}
	page, _ := os.ReadFile("docs/exams.md")
	if !strings.Contains(string(page), "(made once with `cd my-sync && go mod init my-sync`)") {
		t.Fatal("docs/exams.md no longer says how my-sync's module is made")
	}
	goEnv := append(os.Environ(), "GOFLAGS=", "GOTOOLCHAIN=local")
	mod := exec.Command("bash", "-c", "cd my-sync && go mod init my-sync")
	mod.Dir, mod.Env = dir, goEnv
	if out, err := mod.CombinedOutput(); err != nil {
		t.Fatalf("go mod init: %v\n%s", err, out)
	}
	e := newEnv(t, envOptions{wall: true, quiet: true})
	ts := httptest.NewServer(e.h)
	t.Cleanup(ts.Close) // after the two parallel subtests
	shell := func(t *testing.T, block string) ([]byte, []byte, error) {
		sh := exec.Command("bash", "-c", "set -euo pipefail\n"+block)
		sh.Dir = dir
		sh.Env = append(slices.Clip(goEnv), "PATH="+path+string(os.PathListSeparator)+os.Getenv("PATH"), "SANDBOX_EXAM_BASE_URL="+ts.URL+"/v1") // a copy each: the two blocks run side by side
		var stderr bytes.Buffer
		sh.Stderr = &stderr
		out, err := sh.Output()
		return out, stderr.Bytes(), err
	}
	runBlock, shown := examsPageBlock(t, "sandbox exam run order-sync -attempts 2 -- bin/my-sync")
	build, _, _ := strings.Cut(runBlock, "\n") // the lines that build bin/my-sync, which the trace lines run too
	if !strings.HasPrefix(build, "go build -C my-sync ") {
		t.Fatalf("the CI lines no longer start with the client's build: %q", build)
	}
	t.Run("exam run", func(t *testing.T) {
		t.Parallel()
		block := runBlock
		out, stderr, err := shell(t, block)
		margins := regexp.MustCompile(`margin -?\d+ ms`)
		if got := margins.ReplaceAllString(string(out), "margin N ms"); err != nil || got != shown+"\n" {
			t.Errorf("the CI lines: %v\n%s%s\nthe page shows:\n%s", err, got, stderr, shown)
		}
		if !regexp.MustCompile(`(?m)^attempt 2 of 2 exm_[a-z2-7]{20} variant \d+: passed 12/12 \(client exit 0, [0-9.]+ s\)$`).Match(stderr) {
			t.Errorf("exam run's lines: %s", stderr)
		}
	})
	t.Run("exam run -trace-dir, and each trace regraded", func(t *testing.T) {
		t.Parallel()
		block, _ := examsPageBlock(t, "-trace-dir traces")
		if out, errs, err := shell(t, build+"\n"+block); err != nil { // built again beside the other block's build: each renames its binary in whole
			t.Fatalf("the trace lines: %v\n%s%s", err, out, errs)
		}
		report, _ := os.ReadFile(filepath.Join(dir, "exam.xml"))
		traces, _ := filepath.Glob(filepath.Join(dir, "traces", "exm_*.har"))
		if !bytes.Contains(report, []byte(`<testsuite name="exam order-sync rev 2 x 2"`)) || len(traces) != 2 {
			t.Errorf("exam.xml %.200s; traces %v", report, traces)
		}
	})
}

// TestExamsPageMCPSession: docs/exams.md's agent session, order-sync at scale 10 through the
// door's tools only, run as written against a sandbox served here, with stand-ins: an
// Inspector that makes each call as the real one does (one JSON-RPC request, each argument
// of the type the tool's schema gives it), and a sleep that moves the sandbox's clock rather
// than waiting, so that the 120 s attempt takes no time.
func TestExamsPageMCPSession(t *testing.T) {
	t.Parallel()
	needTools(t, "bash", "curl", "jq")
	e := newEnv(t, envOptions{rate: -1, quiet: true, step: -1, mcpKey: "sk_test_sandbox_all"})
	mux := http.NewServeMux()
	mux.Handle("/", e.h)
	mux.HandleFunc("POST /sleep/{seconds}", func(w http.ResponseWriter, r *http.Request) {
		s, _ := strconv.Atoi(r.PathValue("seconds"))
		e.clock.advance(time.Duration(s) * time.Second)
	})
	ts := httptest.NewServer(mux)
	defer ts.Close()
	bin := t.TempDir()
	inspector := `#!/usr/bin/env bash
shift 2; url=$1; shift   # --yes @modelcontextprotocol/inspector, then --cli URL
[ "$1" = --cli ] || { url=$2; shift 2; } || true
method= tool= args='{}'
while [ $# -gt 0 ]; do
  case $1 in
    --cli) url=$2; shift 2 ;;
    --method) method=$2; shift 2 ;;
    --tool-name) tool=$2; shift 2 ;;
    --tool-arg) args=$(jq -c --arg k "${2%%=*}" --arg v "${2#*=}" '. + {($k): $v}' <<<"$args"); shift 2 ;;
    *) echo "inspector: $1?" >&2; exit 1 ;;
  esac
done
rpc() { curl -sf "$url" -H 'Content-Type: application/json' -H 'MCP-Protocol-Version: 2025-11-25' -d "$1"; }
types=$(rpc '{"jsonrpc":"2.0","id":1,"method":"tools/list"}' | jq -c --arg t "$tool" '.result.tools[] | select(.name == $t) | .inputSchema.properties | map_values(.type)')
args=$(jq -c --argjson types "$types" 'with_entries(if ($types[.key] // "string") == "string" then . else .value |= fromjson end)' <<<"$args")
rpc "$(jq -nc --arg n "$tool" --argjson a "$args" '{jsonrpc: "2.0", id: 2, method: "tools/call", params: {name: $n, arguments: $a}}')" | jq '.result'
`
	stubs := map[string]string{"npx": strings.Replace(inspector, "shift 2; url=$1; shift   # --yes @modelcontextprotocol/inspector, then --cli URL\n[ \"$1\" = --cli ] || { url=$2; shift 2; } || true\n", "[ \"$1\" = --yes ] || exit 1; shift 2   # --yes @modelcontextprotocol/inspector\n", 1),
		"sleep": "#!/usr/bin/env bash\ncurl -sf -X POST " + ts.URL + "/sleep/$1\n"}
	for name, text := range stubs {
		if err := os.WriteFile(filepath.Join(bin, name), []byte(text), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	block, shown := examsPageBlock(t, "start_exam")
	sh := exec.Command("bash", "-euo", "pipefail", "-c", strings.ReplaceAll(block, "http://127.0.0.1:8090", ts.URL))
	sh.Dir = t.TempDir()
	sh.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	out, err := sh.CombinedOutput()
	if err != nil || string(out) != shown+"\n" {
		t.Errorf("the session: %v\n%s\nthe page shows:\n%s", err, out, shown)
	}
}

// TestExamsPageFailedGrade: the failed grade docs/exams.md shows is what exam grade prints for
// a sync that keeps a created_from watermark.
func TestExamsPageFailedGrade(t *testing.T) {
	t.Parallel()
	texts := examsPage(t, "text")
	var shown string
	for _, x := range texts {
		if strings.Contains(x, "FAIL ") {
			shown = x
		}
	}
	c := takeExam(t, envOptions{}, `{"exam":"order-sync"}`)
	ts := httptest.NewServer(c.e.h)
	defer ts.Close()
	c.get(t, "/v1/test_helpers/clock")
	watermarkSync(t, c)
	status, out, errs := examCLI(t, c.e, ts.URL+"/v1", nil, "grade", c.x.ID)
	if got := examIDs.ReplaceAllString(out, "exm_ID"); status != 1 || errs != "" || got != shown {
		t.Errorf("%d %q\n%s\nthe page shows:\n%s", status, errs, got, shown)
	}
}

// gradeText shows a grade's checks, for a failure's message.
func gradeText(g gradeOut) string {
	var b strings.Builder
	for _, c := range g.Checks {
		fmt.Fprintf(&b, "  %s %s %v", c.Result, c.ID, c.Requests)
		if c.Detail != nil {
			fmt.Fprintf(&b, ": %s", *c.Detail)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// ===== tracking.go: A booking, a shipment created in a sandbox; main.go, serve: its write =====

// book posts body to POST /v1/test_helpers/shipments with key under the Idempotency-Key
// idem ("" for none).
func (e *env) book(t testing.TB, key, body, idem string, headerPairs ...string) reply {
	t.Helper()
	headers := append([]string{"Content-Type", "application/json"}, headerPairs...)
	if idem != "" {
		headers = append(headers, "Idempotency-Key", idem)
	}
	return e.do(t, newBodyRequest(http.MethodPost, "/v1/test_helpers/shipments", key, body, headers...))
}

// copyOf is a copy of the account of key (a dataset key), made with it, and the copy's
// first key: its start is the env's clock. acct_sync's (sk_test_sync_all) is the marketplace
// that moves; in acct_sandbox's (sk_test_sandbox_all), shp_sbx_unlabelled has no event.
func (e *env) copyOf(t testing.TB, key, idem string) string {
	t.Helper()
	rep, sb := e.postSandbox(t, key, `{}`, idem)
	if rep.status != http.StatusCreated {
		t.Fatalf("a copy of the account of %s: %s", key, rep)
	}
	return sb.Keys[0].Key
}

// shownLink is the shipment_id an order shows, "null" for none (its status when not 200).
func shownLink(t testing.TB, e *env, key, id string, headerPairs ...string) string {
	t.Helper()
	rep := e.get(t, "/v1/orders/"+id, key, headerPairs...)
	if rep.status != http.StatusOK {
		return strconv.Itoa(rep.status)
	}
	var o struct {
		ShipmentID *string `json:"shipment_id"`
	}
	mustDecode(t, rep.body, &o)
	if o.ShipmentID == nil {
		return "null"
	}
	return *o.ShipmentID
}

// TestBooking: a shipment created in a sandbox at the request's instant, its events read
// from then, the order it names linked from then on, seen by the four operations as a
// dataset's shipment is, pages and cursors included, and by the timeline.
func TestBooking(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, step: -1})
	key := e.copyOf(t, "sk_test_sync_all", "copy-1")
	if got := shownLink(t, e, key, "ord_sync_0003"); got != "null" {
		t.Fatalf("before the booking ord_sync_0003 shows shipment_id %s", got)
	}
	first := e.get(t, "/v1/orders?limit=2", key) // a cursor made before the write pages on after it
	if got := string(first.body); !strings.Contains(got, `"id":"ord_sync_0004"`) {
		t.Fatalf("the first page: %s", got)
	}
	body := `{"id":"shp_1","reference":"REF-1","tracking_number":"TN1","parcel_tracking_numbers":["TN2"],"order_id":"ord_sync_0003",` +
		`"events":[{"after":"0s","status":"pre_transit","description":"Label created","location":"Leeds, GB"},{"after":"1h","status":"in_transit","description":"Departed facility"}]}`
	rep := e.book(t, key, body, "book-1")
	want := `{"shipment_id":"shp_1","reference":"REF-1","tracking_number":"TN1","status":"pre_transit","events":[{"status":"pre_transit","description":"Label created","timestamp":"2026-11-22T12:00:00Z","location":"Leeds, GB"}]}`
	if rep.status != 201 || string(rep.body) != want || rep.header.Get("Location") != "/v1/shipments/shp_1/tracking" || rep.header.Get("Content-Type") != "application/json" {
		t.Fatalf("the booking answered %s (Location %q), want 201 %s", rep, rep.header.Get("Location"), want)
	}
	if got := string(e.get(t, "/v1/shipments/shp_1/tracking", key).body); got != want {
		t.Errorf("GET by id at the same instant shows %s, want the 201's view", got)
	}
	if got := string(e.get(t, "/v1/tracking/TN1", key, "Prefer", `clock="start+1h"`).body); !strings.Contains(got, `"status":"in_transit"`) {
		t.Errorf("an hour on, by number: %s", got)
	}
	wantProblem(t, e.get(t, "/v1/tracking/TN2", key), 404, "not_found", "") // a further parcel: not the primary number
	if got := shownLink(t, e, key, "ord_sync_0003"); got != "shp_1" {
		t.Errorf("after the booking ord_sync_0003 shows shipment_id %s", got)
	}
	// Before its creation (a request's own instant), neither the shipment nor the link.
	before := []string{"Prefer", `clock="start-1s"`}
	wantProblem(t, e.get(t, "/v1/shipments/shp_1/tracking", key, before...), 404, "not_found", "")
	if got := shownLink(t, e, key, "ord_sync_0003", before...); got != "null" {
		t.Errorf("a second before the booking ord_sync_0003 shows shipment_id %s", got)
	}
	// Pages and cursors: the link in the page after a cursor made before it.
	next := *decodePage(t, first).Pagination.NextCursor
	if got := string(e.get(t, "/v1/orders?limit=2&cursor="+url.QueryEscape(next), key).body); !strings.Contains(got, `"id":"ord_sync_0003","merchant_reference":"SYNC-1003","platform":"etsy","status":"unfulfilled","shipment_id":"shp_1"`) {
		t.Errorf("the page after the cursor: %s", got)
	}
	if got := string(e.get(t, "/v1/orders?status=unfulfilled&limit=100", key).body); !strings.Contains(got, `"shipment_id":"shp_1"`) {
		t.Errorf("a filtered page: %s", got)
	}
	// The timeline: the creation and the scheduled events.
	var tl struct {
		Shown  []map[string]any `json:"shown"`
		ToCome []map[string]any `json:"to_come"`
	}
	mustDecode(t, e.get(t, "/v1/test_helpers/timeline", key).body, &tl)
	var kinds []string
	for _, x := range append(tl.Shown, tl.ToCome...) {
		if x["id"] == "shp_1" {
			kinds = append(kinds, fmt.Sprint(x["kind"], " ", x["at"], " ", x["status"]))
		}
	}
	if got := strings.Join(kinds, ", "); got != "creation 2026-11-22T12:00:00Z <nil>, event 2026-11-22T12:00:00Z pre_transit, event 2026-11-22T13:00:00Z in_transit" {
		t.Errorf("the timeline holds %s", got)
	}
	// A shipment with no id sent, none linked: an id made for it, found from its instant.
	rep = e.book(t, key, `{"id":null,"reference":"REF-2"}`, "book-2", "Prefer", `clock="start+30s"`)
	var made struct {
		ShipmentID string `json:"shipment_id"`
	}
	mustDecode(t, rep.body, &made)
	if rep.status != 201 || !regexp.MustCompile(`^shp_[a-z2-7]{20}$`).MatchString(made.ShipmentID) || rep.header.Get("Preference-Applied") != `clock="2026-11-22T12:00:30Z"` {
		t.Fatalf("a booking without an id at start+30s: %s", rep)
	}
	wantProblem(t, e.get(t, "/v1/shipments/"+made.ShipmentID+"/tracking", key), 404, "not_found", "") // the sandbox's clock is at start
	if rep := e.get(t, "/v1/shipments/"+made.ShipmentID+"/tracking", key, "Prefer", `clock="start+30s"`); rep.status != 200 {
		t.Errorf("at start+30s the shipment is not found: %s", rep)
	}
	// An order that moves: its status changes and its link, each at its own instant.
	if rep := e.book(t, key, `{"reference":"REF-5","order_id":"ord_sync_0005"}`, "book-5", "Prefer", `clock="start+10s"`); rep.status != 201 {
		t.Fatalf("booking ord_sync_0005: %s", rep)
	}
	for at, want := range map[string]string{"start+5s": `"status":"unfulfilled","shipment_id":null`, "start+10s": `"status":"unfulfilled","shipment_id":"shp_`, "start+30s": `"status":"cancelled","shipment_id":"shp_`} {
		if got := string(e.get(t, "/v1/orders/ord_sync_0005", key, "Prefer", `clock="`+at+`"`).body); !strings.Contains(got, want) {
			t.Errorf("ord_sync_0005 at %s: %s, want %s", at, got, want)
		}
	}
	// Another sandbox of the same template, and the dataset, are not touched.
	other := e.copyOf(t, "sk_test_sync_all", "copy-2")
	if got := shownLink(t, e, other, "ord_sync_0003"); got != "null" {
		t.Errorf("a booking in one copy links the order in another: %s", got)
	}
	if got := shownLink(t, e, "sk_test_sync_all", "ord_sync_0003"); got != "null" {
		t.Errorf("a booking in a copy links the dataset's order: %s", got)
	}
}

// TestBookingRefusals: each rule of the booking both ways, in the contract's order; a
// request refused changes nothing.
func TestBookingRefusals(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, step: -1})
	key := e.copyOf(t, "sk_test_sync_all", "copy")
	if rep := e.book(t, key, `{"id":"shp_a","reference":"A","order_id":"ord_sync_0004"}`, "first"); rep.status != 201 {
		t.Fatalf("the first booking: %s", rep)
	}
	for i, tt := range []struct {
		name, key, body, target string
		headers                 []string
		status                  int
		code, param             string
	}{
		{"no Idempotency-Key", key, `{"reference":"R"}`, "", []string{"Idempotency-Key", ""}, 400, "invalid_idempotency_key", "Idempotency-Key"},
		{"a query parameter", key, `{"reference":"R"}`, "?x=1", nil, 422, "unknown_parameter", "x"},
		{"not one object", key, `[]`, "", nil, 400, "malformed_json", ""},
		{"data after the object", key, `{"reference":"R"} {}`, "", nil, 400, "malformed_json", ""},
		{"not UTF-8", key, "{\"reference\":\"R\xff\"}", "", nil, 400, "malformed_json", ""},
		{"no reference", key, `{"order_id":"ord_sync_0003"}`, "", nil, 422, "invalid_parameter", "reference"},
		{"a null reference", key, `{"reference":null}`, "", nil, 422, "invalid_parameter", "reference"},
		{"an empty id", key, `{"id":"","reference":"R"}`, "", nil, 422, "invalid_parameter", "id"},
		{"created_at: the request decides", key, `{"reference":"R","created_at":"start"}`, "", nil, 422, "unknown_parameter", "created_at"},
		{"an owner", key, `{"reference":"R","account":"acct_sync"}`, "", nil, 422, "unknown_parameter", "account"},
		{"a member twice", key, `{"reference":"R","Reference":"S"}`, "", nil, 422, "invalid_parameter", "Reference"},
		{"members read in the order sent", key, `{"events":5,"reference":5}`, "", nil, 422, "invalid_parameter", "events"},
		{"then filed as a dataset's: its ids before its events", key, `{"events":[{"status":"lost","description":"x"}],"reference":""}`, "", nil, 422, "invalid_parameter", "reference"},
		{"an event's status", key, `{"reference":"R","events":[{"after":"0s","status":"lost","description":"x"}]}`, "", nil, 422, "invalid_parameter", "events[0].status"},
		{"an event without description", key, `{"reference":"R","events":[{"after":"0s","status":"pre_transit"}]}`, "", nil, 422, "invalid_parameter", "events[0].description"},
		{"an after that is no duration", key, `{"reference":"R","events":[{"after":"soon","status":"pre_transit","description":"x"}]}`, "", nil, 422, "invalid_parameter", "events[0].after"},
		{"an empty order_id", key, `{"reference":"R","order_id":""}`, "", nil, 422, "invalid_parameter", "order_id"},
		{"an id the sandbox holds", key, `{"id":"shp_a","reference":"R","order_id":"ord_sync_0003"}`, "", nil, 422, "invalid_parameter", "id"},
		{"an id its records create later", key, `{"id":"shp_sync_1","reference":"R"}`, "", nil, 422, "invalid_parameter", "id"},
		{"the id before the order", key, `{"id":"shp_a","reference":"R","order_id":"ord_none"}`, "", nil, 422, "invalid_parameter", "id"},
		{"an unknown order", key, `{"reference":"R","order_id":"ord_none"}`, "", nil, 404, "not_found", "order_id"},
		{"another account's order", key, `{"reference":"R","order_id":"ord_sbx_0001"}`, "", nil, 404, "not_found", "order_id"},
		{"an order imported later", key, `{"reference":"R","order_id":"ord_sync_0002"}`, "", nil, 404, "not_found", "order_id"},
		{"an order created later", key, `{"reference":"R","order_id":"ord_sync_0006"}`, "", nil, 404, "not_found", "order_id"},
		{"an order linked by an earlier booking", key, `{"reference":"R","order_id":"ord_sync_0004"}`, "", nil, 409, "order_already_linked", "order_id"},
		{"an order its records link later", key, `{"reference":"R","order_id":"ord_sync_0001"}`, "", nil, 409, "order_already_linked", "order_id"},
		{"a dataset's account", "sk_test_sync_all", `{"reference":"R","order_id":"ord_sync_0003"}`, "", nil, 422, "capability_unavailable", ""},
		{"a dataset's account: the order first", "sk_test_sync_all", `{"reference":"R","order_id":"ord_sync_0002"}`, "", nil, 404, "not_found", "order_id"},
		{"a live key", "sk_live_sandbox_all", `{"reference":"R"}`, "", nil, 503, "live_not_released", ""},
		{"a bad Prefer", key, `{"reference":"R"}`, "", []string{"Prefer", "clock=soon"}, 422, "invalid_parameter", "Prefer"},
		{"Prefer code=503: nothing written", key, `{"id":"shp_503","reference":"R","order_id":"ord_sync_0003"}`, "", []string{"Prefer", "code=503"}, 503, "provider_unavailable", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			headers := []string{"Content-Type", "application/json", "Idempotency-Key", "refused-" + strconv.Itoa(i)}
			if len(tt.headers) > 0 && tt.headers[0] == "Idempotency-Key" {
				headers = headers[:2]
			} else {
				headers = append(headers, tt.headers...)
			}
			wantProblem(t, e.do(t, newBodyRequest(http.MethodPost, "/v1/test_helpers/shipments"+tt.target, tt.key, tt.body, headers...)), tt.status, tt.code, tt.param)
		})
	}
	p := wantProblem(t, e.book(t, key, `{"reference":"R","created_at":"start"}`, "created"), 422, "unknown_parameter", "created_at")
	if want := `Unknown member "created_at": a shipment is created at the request's instant (the sandbox's clock, or the request's Prefer: clock="...").`; p.Detail != want {
		t.Errorf("created_at's detail: %s, want %s", p.Detail, want)
	}
	// Nothing of the refusals was written: ord_sync_0003 is free, shp_503 unknown, and a key
	// whose write was refused is free again.
	wantProblem(t, e.get(t, "/v1/shipments/shp_503/tracking", key), 404, "not_found", "")
	if got := shownLink(t, e, key, "ord_sync_0003"); got != "null" {
		t.Errorf("a refused booking linked ord_sync_0003 to %s", got)
	}
	wantProblem(t, e.book(t, key, `{"reference":"R","order_id":"ord_none"}`, "freed"), 404, "not_found", "order_id")
	if rep := e.book(t, key, `{"reference":"R","order_id":"ord_sync_0003"}`, "freed"); rep.status != 201 {
		t.Errorf("the key of a refused write is not free again: %s", rep)
	}
	// The route: POST only; any key of the sandbox, whatever its scopes.
	rep := e.get(t, "/v1/test_helpers/shipments", key)
	wantProblem(t, rep, 405, "method_not_allowed", "")
	if rep.header.Get("Allow") != "POST" {
		t.Errorf("Allow: %q, want POST", rep.header.Get("Allow"))
	}
	_, scoped := e.postSandbox(t, "sk_test_sync_all", `{"keys":[{"scopes":[]}]}`, "no-scopes")
	if rep := e.book(t, scoped.Keys[0].Key, `{"reference":"R","order_id":"ord_sync_0005"}`, "k"); rep.status != 201 {
		t.Errorf("a key without scopes cannot book in its sandbox: %s", rep)
	}
}

// TestBookingAtTheBound: a sandbox holds at most 10,000 shipments; a copy of a template that
// holds them takes no more.
func TestBookingAtTheBound(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	b.WriteString(`{"accounts":[{"id":"acct_full","environments":["test"]}],"keys":[{"key":"sk_test_full","account":"acct_full","environment":"test","scopes":[]}],"shipments":[`)
	for i := range maxSandboxShipments {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"id":"s%d","account":"acct_full","environment":"test","reference":"r"}`, i)
	}
	b.WriteString(`],"orders":[]}`)
	e := newEnv(t, envOptions{rate: -1, step: -1, data: []byte(b.String())})
	_, full := e.postSandbox(t, "sk_test_full", `{}`, "full")
	wantProblem(t, e.book(t, full.Keys[0].Key, `{"reference":"R"}`, "one-more"), 422, "capability_unavailable", "")
	_, fewer := e.postSandbox(t, "sk_test_full", `{"shipments":[{"id":"s1","reference":"r"}]}`, "fewer")
	if rep := e.book(t, fewer.Keys[0].Key, `{"reference":"R"}`, "one-more"); rep.status != 201 {
		t.Errorf("a sandbox of one shipment refuses a second: %s", rep)
	}
}

// TestBookingSeededOrders: the seeded orders of a copy of acct_sandbox link as any order does.
func TestBookingSeededOrders(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, step: -1, seed: 50})
	_, sb := e.postSandbox(t, "sk_test_sandbox_all", `{}`, "seeded")
	key := sb.Keys[0].Key
	if rep := e.book(t, key, `{"id":"shp_s","reference":"R","order_id":"ord_seed_0000007"}`, "b"); rep.status != 201 {
		t.Fatalf("booking a seeded order: %s", rep)
	}
	if got := shownLink(t, e, key, "ord_seed_0000007"); got != "shp_s" {
		t.Errorf("the seeded order shows %s", got)
	}
	wantProblem(t, e.book(t, key, `{"reference":"R","order_id":"ord_seed_0000007"}`, "c"), 409, "order_already_linked", "order_id")
	wantProblem(t, e.book(t, key, `{"reference":"R","order_id":"ord_seed_0000050"}`, "d"), 404, "not_found", "order_id")
	if got := shownLink(t, e, key, "ord_seed_0000008"); got != "null" {
		t.Errorf("another seeded order shows %s", got)
	}
}

// TestBookingIdempotency: the idempotency wrapper on this write, and Prefer: code=502 judged
// last: the shipment created and its 201 stored, the same key replaying it, a new key a
// second booking (409 for the linked order); the journal's members of each.
func TestBookingIdempotency(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, step: -1})
	key := e.copyOf(t, "sk_test_sync_all", "copy")
	body := `{"id":"shp_4","reference":"REF-4","order_id":"ord_sync_0004"}`
	unconfirmed := e.book(t, key, body, "k-4", "Prefer", "code=502")
	wantProblem(t, unconfirmed, 502, "provider_not_confirmed", "")
	if got := shownLink(t, e, key, "ord_sync_0004"); got != "shp_4" {
		t.Fatalf("after the 502 the order shows %s: the write was not done", got)
	}
	first := e.book(t, key, body, `"k-4"`) // the same key, quoted
	if first.status != 201 || first.header.Get("Idempotent-Replayed") != "true" || first.header.Get("Location") != "/v1/shipments/shp_4/tracking" {
		t.Fatalf("the same key again: %s", first)
	}
	if again := e.book(t, key, body, "k-4"); string(again.body) != string(first.body) || again.header.Get("Request-Id") == first.header.Get("Request-Id") {
		t.Errorf("a replay is not byte for byte with its own Request-Id: %s / %s", again.body, first.body)
	}
	wantProblem(t, e.book(t, key, `{"reference":"other"}`, "k-4"), 409, "idempotency_key_reused", "")
	wantProblem(t, e.book(t, key, body, "k-4-new"), 422, "invalid_parameter", "id") // a second booking: the id is held
	wantProblem(t, e.book(t, key, `{"reference":"REF-4","order_id":"ord_sync_0004"}`, "k-4-new"), 409, "order_already_linked", "order_id")
	j := e.journalOf(t, key, "")
	var got []string
	for _, x := range j.Data {
		code, idem := "-", "-"
		if x.Code != nil {
			code = *x.Code
		}
		if x.IdempotencyKey != nil {
			idem = *x.IdempotencyKey
		}
		got = append(got, fmt.Sprintf("%d %s %s %v", x.Status, code, idem, x.IDs))
	}
	want := []string{"502 provider_not_confirmed k-4 []", "200 - - [ord_sync_0004]", `201 - "k-4" [shp_4]`, "201 - k-4 [shp_4]", "409 idempotency_key_reused k-4 []", "422 invalid_parameter k-4-new []", "409 order_already_linked k-4-new []"}
	if j.Data[0].Route != "/v1/test_helpers/shipments" || strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("the journal:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	var har struct {
		Log struct {
			Entries []struct {
				Request struct {
					Headers  []struct{ Name, Value string } `json:"headers"`
					BodySize int                            `json:"bodySize"`
				} `json:"request"`
			} `json:"entries"`
		} `json:"log"`
	}
	mustDecode(t, e.get(t, "/v1/test_helpers/requests?format=har&limit=1", key).body, &har)
	r := har.Log.Entries[0].Request
	if r.BodySize != len(body) || !slices.ContainsFunc(r.Headers, func(h struct{ Name, Value string }) bool { return h.Name == "Idempotency-Key" && h.Value == "k-4" }) {
		t.Errorf("the HAR request: %+v", r)
	}
}

// TestBlindRetry: the fifth finding, both ways: a 502 retried with the same key is none; one
// sent again under another key, once its answer had come, is cited with its first such
// retry; another body, another target or another API key is none.
func TestBlindRetry(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, step: -1})
	key := e.copyOf(t, "sk_test_sync_all", "copy")
	body := `{"reference":"REF-5","order_id":"ord_sync_0005"}`
	e.book(t, key, body, "a", "Prefer", "code=502")           // 1: done, answered 502
	e.book(t, key, body, "a")                                 // 2: the same key: its 201
	e.book(t, key, `{"reference":"REF-5"}`, "b")              // 3: another body
	e.book(t, key, body, `"a"`)                               // 4: the same key, quoted
	if got := e.findingsOf(t, key, "").summary(); got != "" { // retried right
		t.Fatalf("a 502 retried with its key is found: %s", got)
	}
	e.book(t, key, body, "c")                                          // 5: a new key: a second booking, 409
	e.book(t, key, body, "d")                                          // 6: again
	e.book(t, key, `{"reference":"REF-3"}`, "e", "Prefer", "code=502") // 7: done, answered 502, never retried
	f := e.findingsOf(t, key, "")
	if len(f.Data) != 1 || f.Data[0].Code != "blind_retry" || fmt.Sprint(f.Data[0].Requests) != "[1 5]" || f.Data[0].ID == nil || !strings.HasPrefix(*f.Data[0].ID, "shp_") {
		t.Fatalf("findings: %s", f.summary())
	}
	if want := `POST /v1/test_helpers/shipments was answered 502 (request 1), but the write was done; request 5 sent the same body again under another Idempotency-Key ("c", not "a"), which writes a second time (a second link of an order is 409 order_already_linked): retry a 502 with the same Idempotency-Key, which answers the first write's result.`; f.Data[0].Detail != want {
		t.Errorf("detail:\n%s\nwant\n%s", f.Data[0].Detail, want)
	}
	if got := shownLink(t, e, key, "ord_sync_0005"); got != *f.Data[0].ID {
		t.Errorf("the finding names %s, the order is linked to %s", *f.Data[0].ID, got)
	}
	// Another API key of the sandbox sending it again is another client: no finding.
	_, two := e.postSandbox(t, "sk_test_sync_all", `{"keys":[{"scopes":[]},{"scopes":[]}]}`, "two-keys")
	e.book(t, two.Keys[0].Key, body, "x", "Prefer", "code=502")
	e.book(t, two.Keys[1].Key, body, "y")
	if got := e.findingsOf(t, two.Keys[0].Key, "").summary(); got != "" {
		t.Errorf("another API key's request is found: %s", got)
	}
	// Making a sandbox is a write too.
	e.postSandbox(t, "sk_test_sync_all", `{"template":"acct_sync"}`, "s-1", "Prefer", "code=502, run=\"blind\"")
	e.postSandbox(t, "sk_test_sync_all", `{"template":"acct_sync"}`, "s-2", "Prefer", "run=\"blind\"")
	if got := e.findingsOf(t, "sk_test_sync_all", "run=blind").summary(); !regexp.MustCompile(`^blind_retry - \[\d+ \d+\]$`).MatchString(got) {
		t.Errorf("a sandbox made twice: %q", got)
	}
}

// TestBookingIsJudgedByTheVersionItRead: each entry is judged against the data its own
// request read: a shipment created later never changes what an earlier entry saw, so the
// findings of entries already judged stay as they were, and an order seen unlinked, then
// linked by a write, is stale at a later read.
func TestBookingIsJudgedByTheVersionItRead(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, step: -1})
	// Linked at the sandbox's start, and at the order's import itself (start-2m): a link no
	// instant moves, which only the version does.
	for i, linked := range []string{"start", "start-2m"} {
		t.Run(linked, func(t *testing.T) {
			key := e.copyOf(t, "sk_test_sync_all", "copy-"+linked)
			later := []string{"Prefer", `clock="start+10m", run="r"`}
			e.get(t, "/v1/orders/ord_sync_0003", key, later...) // 1: unlinked, at +10 min
			e.get(t, "/v1/orders/ord_sync_0004", key, later...) // 2: the latest read
			judged := e.findingsOf(t, key, "run=r").summary()
			if rep := e.book(t, key, `{"reference":"R","order_id":"ord_sync_0003"}`, "b", "Prefer", `clock="`+linked+`"`); rep.status != 201 {
				t.Fatalf("the booking: %s", rep)
			}
			if got := e.findingsOf(t, key, "run=r").summary(); got != judged || got != "" {
				t.Errorf("the findings of entries read before the write were %q, after it %q", judged, got)
			}
			e.get(t, "/v1/orders/ord_sync_0004", key, later...) // 4: the latest read, of the data with the link
			if got := e.findingsOf(t, key, "run=r").summary(); !regexp.MustCompile(`^stale_order ord_sync_0003 \[1 4\]$`).MatchString(got) {
				t.Errorf("ord_sync_0003 seen unlinked, then linked by a write (%d): %q", i, got)
			}
			e.get(t, "/v1/orders/ord_sync_0003", key, later...) // 5: seen again, linked
			if got := e.findingsOf(t, key, "run=r").summary(); got != "" {
				t.Errorf("after the order was read again: %q", got)
			}
		})
	}
}

// TestBlindRetriesAgreeWithTheirDefinition: the search blind_retry makes of each group
// finds what the contract's definition, asked of every later entry, finds: random journals
// of writes of two bodies, answered 502 or not, arriving at random instants with random
// durations under a few keys.
func TestBlindRetriesAgreeWithTheirDefinition(t *testing.T) {
	t.Parallel()
	k := &apiKey{}
	rnd := rand.New(rand.NewPCG(7, 34))
	for run := range 200 {
		es := make([]journalEntry, 1+rnd.IntN(60))
		for i := range es {
			es[i] = journalEntry{seq: uint64(i + 1), key: k, method: "POST", target: "/v1/test_helpers/shipments", status: int16([]int{201, 409, 502}[rnd.IntN(3)]),
				arrived: int64(i*10 + rnd.IntN(40)), duration: int64(rnd.IntN(60)), write: &writeMark{key: strconv.Itoa(rnd.IntN(4)), body: [32]byte{byte(rnd.IntN(2))}}}
		}
		var want []string
		for a := range es {
			A := &es[a]
			if A.status != 502 {
				continue
			}
			for b := a + 1; b < len(es); b++ {
				if B := &es[b]; B.write.body == A.write.body && B.arrived >= A.arrived+A.duration && B.write.key != A.write.key {
					want = append(want, fmt.Sprint(a, b))
					break
				}
			}
		}
		var got []string
		for _, f := range blindRetries(es) {
			got = append(got, fmt.Sprint(f.cited[0], f.cited[1]))
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("journal %d: found %v, by the definition %v", run, got, want)
		}
	}
}

// TestTimelineMergesABookingsHappenings: a booking's happenings merged into the sandbox's
// timeline stand where sorting them appended to it puts them, ties as given.
func TestTimelineMergesABookingsHappenings(t *testing.T) {
	t.Parallel()
	rnd := rand.New(rand.NewPCG(3, 4))
	random := func(n int) []happening {
		hs := make([]happening, n)
		for i := range hs {
			hs[i] = happening{at: testNow.Add(time.Duration(rnd.IntN(5)) * time.Second), kind: happeningKind(rnd.IntN(4)), id: strconv.Itoa(rnd.IntN(3)), status: strconv.Itoa(i)}
		}
		return hs
	}
	for range 200 {
		tl, hs := random(rnd.IntN(30)), random(rnd.IntN(10))
		sortHappenings(tl)
		want := append(slices.Clone(tl), hs...)
		sortHappenings(want)
		if got := withHappenings(tl, slices.Clone(hs)); !slices.Equal(got, want) {
			t.Fatalf("merged:\n%v\nsorted:\n%v", got, want)
		}
	}
}

// TestBookingMakesANumberAmbiguous: a shipment created with the number another holds makes
// the lookup by number a 404 from its creation on, and the findings judge the lookups so:
// the one before the booking found its shipment, the one after is ambiguous_number.
func TestBookingMakesANumberAmbiguous(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, step: -1})
	key := e.copyOf(t, "sk_test_sync_all", "copy")
	at := []string{"Prefer", `clock="start+2m"`}
	if rep := e.get(t, "/v1/tracking/SYNC1000000001", key, at...); rep.status != 200 { // 1: shp_sync_1
		t.Fatalf("before the booking: %s", rep)
	}
	if rep := e.book(t, key, `{"id":"shp_twin","reference":"R","tracking_number":"SYNC1000000001"}`, "b", "Prefer", `clock="start+90s"`); rep.status != 201 {
		t.Fatalf("the booking: %s", rep)
	}
	if got := e.findingsOf(t, key, "").summary(); got != "" {
		t.Errorf("the lookup made before the booking is found: %q", got)
	}
	wantProblem(t, e.get(t, "/v1/tracking/SYNC1000000001", key, at...), 404, "not_found", "")                  // 3
	if rep := e.get(t, "/v1/tracking/SYNC1000000001", key, "Prefer", `clock="start+80s"`); rep.status != 200 { // 4: before the twin's creation
		t.Errorf("before the twin's creation: %s", rep)
	}
	if got := e.findingsOf(t, key, "").summary(); got != "ambiguous_number - [3]" {
		t.Errorf("findings: %q", got)
	}
}

// TestSandboxesWithinTheirBytes: the sandboxes' data, the records a sandbox was sent
// included, stays within the registry's bytes: past them a new sandbox, or a booking that grows
// one, forgets the least recently used other first; a booking that would take one sandbox
// alone past them is refused.
func TestSandboxesWithinTheirBytes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1}) // the wall clock moves a second a reading: each use is later
	var orders []string
	for i := range 200 {
		orders = append(orders, fmt.Sprintf(`{"id":"ord_%d","merchant_reference":"R-%d","platform":"ebay","status":"unfulfilled","created_at":"start-%dm"}`, i, i, i+1))
	}
	body := `{"orders":[` + strings.Join(orders, ",") + `]}`
	book := e.srv.registry
	setMax := func(n int64) { book.mu.Lock(); book.maxBytes = n; book.mu.Unlock() }
	_, a := e.postSandbox(t, "sk_test_sandbox_all", body, "a")
	one := sandboxHoldings(e).data
	if d := sandboxTenant(e, a.Account).current(); !d.source.own || one < d.orders.bytes()+d.source.recs.bytes() {
		t.Fatalf("a sandbox of records counts %d bytes, its orders and their records %d and %d: its records are not counted", one, d.orders.bytes(), d.source.recs.bytes())
	}
	setMax(2*one + one/2)
	_, b := e.postSandbox(t, "sk_test_sandbox_all", body, "b")
	_, c := e.postSandbox(t, "sk_test_sandbox_all", body, "c") // a, used least recently, goes
	wantProblem(t, e.get(t, "/v1/orders/ord_1", a.Keys[0].Key), 401, "invalid_api_key", "")
	setMax(sandboxHoldings(e).data + 1) // the next booking grows c past the bound: b goes
	if rep := e.book(t, c.Keys[0].Key, `{"reference":"R","order_id":"ord_1"}`, "grow"); rep.status != 201 {
		t.Fatalf("the booking: %s", rep)
	}
	wantProblem(t, e.get(t, "/v1/orders/ord_1", b.Keys[0].Key), 401, "invalid_api_key", "")
	if got, h := shownLink(t, e, c.Keys[0].Key, "ord_1"), sandboxHoldings(e); !strings.HasPrefix(got, "shp_") || h.sandboxes != 1 || h.data > book.maxBytes {
		t.Errorf("the sandbox written to shows %s; the book holds %d sandboxes, %d of %d bytes", got, h.sandboxes, h.data, book.maxBytes)
	}
	// A booking that would take one sandbox's data alone past the bound is refused, whatever
	// the others hold: nothing written.
	setMax(sandboxHoldings(e).data + 1000) // c's alone
	events := strings.Repeat(`{"after":"1s","status":"in_transit","description":"Departed"},`, 100)
	wantProblem(t, e.book(t, c.Keys[0].Key, `{"id":"shp_big","reference":"R","order_id":"ord_2","events":[`+strings.TrimSuffix(events, ",")+`]}`, "big"), 422, "capability_unavailable", "")
	wantProblem(t, e.get(t, "/v1/shipments/shp_big/tracking", c.Keys[0].Key, "Prefer", `clock="start+1h"`), 404, "not_found", "")
	if got, h := shownLink(t, e, c.Keys[0].Key, "ord_2"), sandboxHoldings(e); got != "null" || h.data > book.maxBytes {
		t.Errorf("a refused booking linked ord_2 to %s; the book holds %d of %d bytes", got, h.data, book.maxBytes)
	}
}

// TestDomainAdapterProfile: a sandbox made with profile domain_adapter answers as the spec
// says the unreleased domain adapter will, where the two differ, and nowhere else: a number
// two or more shipments hold is 409 ambiguous_tracking_number (saying how many hold it), not
// 404, and is no ambiguous_number finding; a booking from an order is 422
// capability_unavailable, before any other state check; without one it is 201. A profile
// is judged at its place in the body.
func TestDomainAdapterProfile(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, step: -1})
	for _, tt := range []struct{ body, code, param string }{
		{`{"profile":"live"}`, "invalid_parameter", "profile"},
		{`{"profile":null}`, "invalid_parameter", "profile"},
		{`{"profile":"domain_adapter","profile":"sandbox"}`, "invalid_parameter", "profile"},
		{`{"profile":"bogus","foo":1}`, "invalid_parameter", "profile"},
		{`{"foo":1,"profile":"bogus"}`, "unknown_parameter", "foo"},
	} {
		rep, _ := e.postSandbox(t, "sk_test_sandbox_all", tt.body, fmt.Sprintf("refused-%x", sha256.Sum256([]byte(tt.body))))
		wantProblem(t, rep, 422, tt.code, tt.param)
	}
	if _, plain := e.postSandbox(t, "sk_test_sandbox_all", `{}`, "plain"); plain.Profile != "sandbox" {
		t.Errorf("a sandbox made without a profile answers profile %q, want sandbox", plain.Profile)
	}
	rep, sb := e.postSandbox(t, "sk_test_sandbox_all", `{"template":"acct_sandbox","profile":"domain_adapter"}`, "adapter")
	if rep.status != 201 || sb.Profile != "domain_adapter" {
		t.Fatalf("a domain adapter's copy of acct_sandbox: %s", rep)
	}
	key := sb.Keys[0].Key
	p := wantProblem(t, e.get(t, "/v1/tracking/SBX2000000000", key), 409, "ambiguous_tracking_number", "")
	if !strings.Contains(p.Detail, "held by 2 shipments") || !strings.Contains(p.Detail, "GET /v1/shipments/{id}/tracking") {
		t.Errorf("the 409's detail: %s", p.Detail)
	}
	if rep := e.do(t, newRequest(http.MethodHead, "/v1/tracking/SBX2000000000", key)); rep.status != 409 { // net/http sends no body of a HEAD answer
		t.Errorf("HEAD of an ambiguous number: %s", rep)
	}
	for target, want := range map[string]int{"/v1/shipments/shp_sbx_twin_a/tracking": 200, "/v1/tracking/SBX1000000001": 200, "/v1/tracking/SBX3000000002": 404, "/v1/tracking/NOPE": 404} {
		if rep := e.get(t, target, key); rep.status != want {
			t.Errorf("GET %s in the domain adapter's copy: %d, want %d", target, rep.status, want)
		}
	}
	if got := e.findingsOf(t, key, "").summary(); !regexp.MustCompile(`^parcel_number_lookup shp_sbx_parcels \[\d+\]$`).MatchString(got) { // the further parcel's number is one, the 409 none
		t.Errorf("a 409 of an ambiguous number is a finding: %s", got)
	}
	// The default profile answers the same number 404, and finds it.
	wantProblem(t, e.get(t, "/v1/tracking/SBX2000000000", plainKey(t, e)), 404, "not_found", "")
	// Bookings: from an order, refused first; without one, written, and a third holder counted.
	_, sync := e.postSandbox(t, "sk_test_sync_all", `{"profile":"domain_adapter"}`, "adapter-sync")
	for _, order := range []string{"ord_sync_0003", "ord_nope"} {
		wantProblem(t, e.book(t, sync.Keys[0].Key, `{"reference":"R","order_id":"`+order+`"}`, "link-"+order), 422, "capability_unavailable", "")
	}
	if rep := e.book(t, key, `{"reference":"R","tracking_number":"SBX2000000000"}`, "third"); rep.status != 201 {
		t.Fatalf("a booking without an order: %s", rep)
	}
	if p := wantProblem(t, e.get(t, "/v1/tracking/SBX2000000000", key), 409, "ambiguous_tracking_number", ""); !strings.Contains(p.Detail, "held by 3 shipments") {
		t.Errorf("with a third holder: %s", p.Detail)
	}
	if got := shownLink(t, e, sync.Keys[0].Key, "ord_sync_0003"); got != "null" {
		t.Errorf("a refused booking linked the order to %s", got)
	}
}

// plainKey is the key of a copy of acct_sandbox of the default profile.
func plainKey(t *testing.T, e *env) string {
	t.Helper()
	_, sb := e.postSandbox(t, "sk_test_sandbox_all", `{"template":"acct_sandbox"}`, "plain-copy")
	return sb.Keys[0].Key
}

// TestBookingsRacingReads: writes racing reads of their sandbox (run with -race): a reader
// sees the sandbox before a write or after it, never between: every link a page shows is
// a shipment the next request finds, and every order a found shipment was created for shows
// its link.
func TestBookingsRacingReads(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, step: -1, seed: 200})
	_, sb := e.postSandbox(t, "sk_test_sandbox_all", `{}`, "race")
	key, tenant := sb.Keys[0].Key, sandboxTenant(e, sb.Account)
	at := []string{"Prefer", `clock="start+1h"`}
	const writers, each = 4, 15
	var wg sync.WaitGroup
	done := make(chan struct{})
	var reading sync.WaitGroup // the writers start once each reader has read once
	reading.Add(2)
	var reads [2]atomic.Int64 // each reader's reads
	var versions sync.Map     // the versions the readers saw, by their writes
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reading.Wait()
			for i := range each {
				n := w*each + i
				rep := e.book(t, key, fmt.Sprintf(`{"id":"shp_r%d","reference":"R","order_id":"ord_seed_%07d"}`, n, 199-n), "w-"+strconv.Itoa(n)) // the newest: the first page
				if rep.status != 201 {
					t.Errorf("booking %d: %s", n, rep)
				}
			}
		}()
	}
	var readers sync.WaitGroup
	for r := range 2 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for {
				if reads[r].Load() == 1 {
					reading.Done()
				}
				select {
				case <-done:
					return
				default:
				}
				var page struct {
					Data []struct {
						ID         string  `json:"id"`
						ShipmentID *string `json:"shipment_id"`
					} `json:"data"`
				}
				if rep := e.get(t, "/v1/orders?limit=100", key, at...); json.Unmarshal(rep.body, &page) != nil {
					t.Errorf("a page that is not JSON: %s", rep)
					return
				}
				for _, o := range page.Data {
					if o.ShipmentID != nil && strings.HasPrefix(*o.ShipmentID, "shp_r") {
						if rep := e.get(t, "/v1/shipments/"+*o.ShipmentID+"/tracking", key, at...); rep.status != 200 {
							t.Errorf("order %s links %s, which is not found: %s", o.ID, *o.ShipmentID, rep)
						}
					}
				}
				d := tenant.current() // one version, whole
				for _, l := range d.links {
					if d.shipments.find(l.shipmentID) == nil {
						t.Errorf("a version links %s to %s, which it does not hold", l.orderID, l.shipmentID)
					}
				}
				versions.Store(d.writes, true)
				reads[r].Add(1)
			}
		}()
	}
	wg.Wait()
	after := [2]int64{reads[0].Load(), reads[1].Load()}
	waitFor(t, "each reader to read once more after the writes", func() bool { return reads[0].Load() > after[0] && reads[1].Load() > after[1] })
	close(done)
	readers.Wait()
	seen := 0
	versions.Range(func(any, any) bool { seen++; return true })
	if _, first := versions.Load(uint32(0)); !first || seen < 2 {
		t.Errorf("the readers saw %d versions (the first among them: %v): they did not read across the writes", seen, first)
	}
	t.Logf("the readers read %d and %d times, seeing %d versions of %d", reads[0].Load(), reads[1].Load(), seen, writers*each+1)
	if got := listIDs(t, e.get(t, "/v1/orders?limit=100", key, at...)); got == "" {
		t.Fatal("no orders")
	}
	for n := range writers * each {
		if got := shownLink(t, e, key, fmt.Sprintf("ord_seed_%07d", 199-n), at...); got != "shp_r"+strconv.Itoa(n) {
			t.Errorf("ord_seed_%07d shows %s after the writes", 199-n, got)
		}
	}
	// Bookings of one order at once, each under its own key: one links it, the others are
	// the second link.
	statuses := make([]int, 8)
	var same sync.WaitGroup
	for i := range statuses {
		same.Add(1)
		go func() {
			defer same.Done()
			statuses[i] = e.book(t, key, `{"reference":"R","order_id":"ord_seed_0000000"}`, "same-"+strconv.Itoa(i)).status
		}()
	}
	same.Wait()
	slices.Sort(statuses)
	if fmt.Sprint(statuses) != "[201 409 409 409 409 409 409 409]" {
		t.Errorf("bookings of one order at once answered %v", statuses)
	}
}

// FuzzBookingBody: any body of POST /v1/test_helpers/shipments is a 201, whose shipment
// is then found where its Location says, or a 4xx that writes nothing; never a 5xx.
func FuzzBookingBody(f *testing.F) {
	e := newEnv(f, envOptions{rate: -1, quiet: true, journal: -1, step: -1}) // a frozen clock: the sandbox stays
	for _, body := range []string{
		`{"reference":"R"}`, `{"id":"shp_1","reference":"R","tracking_number":"T1","parcel_tracking_numbers":["T2"],"order_id":"ord_sync_0003",` +
			`"events":[{"after":"0s","status":"pre_transit","description":"D","location":"L"},{"timestamp":"2026-11-22T12:05:00+01:00","status":"in_transit","description":"E"},{"timestamp":"x","status":"failure","description":"F"}]}`,
		`{"reference":"R","order_id":"ord_sync_0001"}`, `{"reference":"R","order_id":"ord_sync_0002"}`, `{"id":null,"reference":"R","events":null}`,
		`{"reference":"R","created_at":"start"}`, `[]`, `{"reference":1}`, "{\"reference\":\"\xff\"}", `{"Reference":"R","reference":"R"}`, `{"reference":"R","events":[{"after":"-72h","status":"delivered","description":"D"}]}`,
	} {
		f.Add(body)
	}
	var key string
	n := 0
	f.Fuzz(func(t *testing.T, body string) {
		if n%500 == 0 { // a fresh copy now and then: each write copies what the sandbox holds
			key = e.copyOf(t, "sk_test_sync_all", "fuzz-copy-"+strconv.Itoa(n))
		}
		n++
		tenant := e.srv.keys.sandboxes.find(sha256.Sum256([]byte(key)), e.clock.now()).tenant
		before := tenant.current()
		rep := e.book(t, key, body, "fuzz-"+strconv.Itoa(n)) // checks the answer against the document
		switch rep.status {
		case http.StatusCreated:
			if got := e.get(t, rep.header.Get("Location"), key); got.status != 200 || string(got.body) != string(rep.body) {
				t.Fatalf("%q: 201 %s, but its Location answers %s", body, rep.body, got)
			}
		case http.StatusBadRequest, http.StatusNotFound, http.StatusConflict, http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity:
			if tenant.current() != before {
				t.Fatalf("a refused body (%s) wrote", rep)
			}
		default:
			t.Fatalf("%q = %s", body, rep)
		}
	})
}

// bookingDataset is a -data dataset of two accounts of 10,000 orders each (one in ten
// changes status, one in a hundred is imported late): acct_big, a template with no
// shipment, and acct_linked, whose first 1,000 orders are linked to shipments its records
// create at its start, as 1,000 bookings made in a copy of acct_big link them.
func bookingDataset() []byte {
	var b strings.Builder
	b.WriteString(`{"accounts":[{"id":"acct_big","environments":["test"]},{"id":"acct_linked","environments":["test"]}],`)
	b.WriteString(`"keys":[{"key":"sk_test_big_all","account":"acct_big","environment":"test","scopes":["tracking:read","orders:read"]},{"key":"sk_test_linked_all","account":"acct_linked","environment":"test","scopes":["tracking:read","orders:read"]}],"shipments":[`)
	for i := range 1000 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"id":"shp_%05d","account":"acct_linked","environment":"test","reference":"B-%d","tracking_number":"TB%05d","order_id":"ord_%05d","created_at":"start","events":[{"after":"0s","status":"pre_transit","description":"Label created"}]}`, i, i, i, i)
	}
	b.WriteString(`],"orders":[`)
	for _, account := range []string{"acct_big", "acct_linked"} {
		for i := range maxSandboxRecords {
			if account != "acct_big" || i > 0 {
				b.WriteByte(',')
			}
			extra := ""
			switch {
			case i%100 == 7:
				extra = fmt.Sprintf(`,"imported_at":"start-%ds"`, i)
			case i%10 == 3:
				extra = fmt.Sprintf(`,"changes":[{"status":"fulfilled","at":"start-%ds"}]`, i)
			}
			fmt.Fprintf(&b, `{"id":"ord_%05d","account":"%s","environment":"test","merchant_reference":"R-%05d","platform":"%s","status":"unfulfilled","created_at":"start-%dm"%s}`, i, account, i, platforms[i%len(platforms)], i, extra)
		}
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

// bookingBenchEnv serves bookingDataset as benchEnv serves the default one, its start an
// hour ago (its shipments are created by now).
func bookingBenchEnv(b *testing.B) *env {
	return benchEnvOf(b, bookingDataset(), 0, time.Now().Add(-time.Hour))
}

// benchSandbox makes a copy of the account of a dataset key and returns its key.
func benchSandbox(b *testing.B, e *env, key string) string {
	b.Helper()
	w := &benchWriter{h: http.Header{}}
	e.h.ServeHTTP(w, newBodyRequest(http.MethodPost, "/v1/test_helpers/sandboxes", key, `{}`, "Idempotency-Key", randomText(8)))
	var made sandboxAnswer
	if w.status != http.StatusCreated || json.Unmarshal(w.buf, &made) != nil {
		b.Fatalf("%d %s", w.status, w.buf)
	}
	return made.Keys[0].Key
}

// book creates the shipment of order i in the sandbox of key.
func book(b *testing.B, e *env, key string, i int) {
	w := &benchWriter{h: http.Header{}}
	body := fmt.Sprintf(`{"reference":"B-%d","tracking_number":"TB%05d","order_id":"ord_%05d","events":[{"after":"0s","status":"pre_transit","description":"Label created"}]}`, i, i, i)
	e.h.ServeHTTP(w, newBodyRequest(http.MethodPost, "/v1/test_helpers/shipments", key, body, "Idempotency-Key", strconv.Itoa(i)))
	if w.status != http.StatusCreated {
		b.Fatalf("%d %s", w.status, w.buf)
	}
}

// BenchmarkCreateShipment: a shipment created in a copy of a -data template of 10,000
// orders, each linking an order of its own (the contract: a median within 10 ms), a new
// copy every 1,000 bookings; and the worst arrangement: a template of 10,000 orders and
// 9,000 shipments, each booking a 255 KiB body of 2,589 scheduled events (the timeline grows
// by as many), a new copy every 100. Each reports its median and 90th percentile.
func BenchmarkCreateShipment(b *testing.B) {
	b.Run("linking", func(b *testing.B) {
		e := bookingBenchEnv(b)
		benchBookings(b, func() string { return benchSandbox(b, e, "sk_test_big_all") }, 1000, func(key string, i int) { book(b, e, key, i) })
	})
	b.Run("worst", func(b *testing.B) {
		var d strings.Builder
		d.WriteString(`{"accounts":[{"id":"acct_full","environments":["test"]}],"keys":[{"key":"sk_test_full","account":"acct_full","environment":"test","scopes":[]}],"shipments":[`)
		for i := range 9000 {
			fmt.Fprintf(&d, `%s{"id":"s%d","account":"acct_full","environment":"test","reference":"R","tracking_number":"T%d","events":[{"after":"%ds","status":"in_transit","description":"Departed"}]}`, map[bool]string{true: ",", false: ""}[i > 0], i, i, i)
		}
		d.WriteString(`],"orders":[`)
		for i := range maxSandboxRecords {
			change := ""
			if i%10 == 3 {
				change = fmt.Sprintf(`,"changes":[{"status":"fulfilled","at":"start+%ds"}]`, i)
			}
			fmt.Fprintf(&d, `%s{"id":"ord_%05d","account":"acct_full","environment":"test","merchant_reference":"R","platform":"ebay","status":"unfulfilled","created_at":"start-%dm"%s}`, map[bool]string{true: ",", false: ""}[i > 0], i, i, change)
		}
		d.WriteString(`]}`)
		e := benchEnvOf(b, []byte(d.String()), 0, time.Now())
		var events []string
		for size := 100; size < maxBodyBytes-200; {
			ev := fmt.Sprintf(`{"after":"%ds","status":"in_transit","description":"Departed facility %d","location":"Leeds, GB"}`, len(events), len(events))
			events, size = append(events, ev), size+len(ev)+1
		}
		benchBookings(b, func() string { return benchSandbox(b, e, "sk_test_full") }, 100, func(key string, i int) {
			w := &benchWriter{h: http.Header{}}
			body := fmt.Sprintf(`{"reference":"R","order_id":"ord_%05d","events":[%s]}`, i, strings.Join(events, ","))
			e.h.ServeHTTP(w, newBodyRequest(http.MethodPost, "/v1/test_helpers/shipments", key, body, "Idempotency-Key", strconv.Itoa(i)))
			if w.status != http.StatusCreated {
				b.Fatalf("%d %s", w.status, w.buf)
			}
		})
	})
}

// benchBookings times bookings, the i-th of a sandbox made anew every each, and reports the
// median and the 90th percentile.
func benchBookings(b *testing.B, sandbox func() string, each int, booking func(key string, i int)) {
	var key string
	var took []time.Duration
	for b.Loop() {
		i := len(took) % each
		if i == 0 {
			b.StopTimer()
			key = sandbox()
			b.StartTimer()
		}
		began := time.Now()
		booking(key, i)
		took = append(took, time.Since(began))
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2])/1e6, "ms-median")
	b.ReportMetric(float64(took[len(took)*9/10])/1e6, "ms-p90")
}

// BenchmarkSandboxReads: GET by id of a linked order, a limit=100 page of linked orders and
// a tracking view by number, in a copy of acct_big before any write and after 1,000
// bookings, against the same sandbox made from records (a copy of acct_linked, whose
// records hold the same 1,000 links) and against acct_linked itself, a dataset's account.
func BenchmarkSandboxReads(b *testing.B) {
	e := bookingBenchEnv(b)
	before, after, records := benchSandbox(b, e, "sk_test_big_all"), benchSandbox(b, e, "sk_test_big_all"), benchSandbox(b, e, "sk_test_linked_all")
	for i := range 1000 {
		book(b, e, after, i)
	}
	for _, tt := range []struct{ name, key string }{{"dataset_records", "sk_test_linked_all"}, {"sandbox_of_records", records}, {"sandbox_before_writes", before}, {"sandbox_after_1000_writes", after}} {
		b.Run(tt.name+"/get_order", func(b *testing.B) {
			benchServe(b, e.h, newRequest("GET", "/v1/orders/ord_00500", tt.key), 200)
		})
		b.Run(tt.name+"/list_orders", func(b *testing.B) {
			benchServe(b, e.h, newRequest("GET", "/v1/orders?limit=100", tt.key), 200)
		})
		b.Run(tt.name+"/tracking_by_number", func(b *testing.B) {
			if tt.key == before {
				b.Skip("no shipment before the writes")
			}
			benchServe(b, e.h, newRequest("GET", "/v1/tracking/TB00500", tt.key), 200)
		})
	}
}

// ===== tracking.go: Shipment events, added to a sandbox's shipment =====

// addEvents posts events (or the shorthand) for the shipment id of key's sandbox, under the
// Idempotency-Key idem ("" for none).
func (e *env) addEvents(t testing.TB, key, id, body, idem string, headerPairs ...string) reply {
	t.Helper()
	headers := append([]string{"Content-Type", "application/json"}, headerPairs...)
	if idem != "" {
		headers = append(headers, "Idempotency-Key", idem)
	}
	return e.do(t, newBodyRequest(http.MethodPost, "/v1/test_helpers/shipments/"+id+"/events", key, body, headers...))
}

// viewOf decodes a tracking view, of a 200 or a 201, strictly.
func viewOf(t testing.TB, rep reply) trackingView {
	t.Helper()
	if rep.status != http.StatusOK && rep.status != http.StatusCreated {
		t.Fatalf("answered %s, want a tracking view", rep)
	}
	var v trackingView
	mustDecodeExact(t, rep.body, &v)
	return v
}

// TestMovingAShipment: events arrive for a sandbox's shipment at the request's instant, in
// each form: raw events in the dataset's format, or the shorthand of one status (with its
// location, or ""); normalized as at load (UTC, one of each duplicate, a stored event held
// once, none without an offset, oldest first, the status the last shown event's); 201 with
// Location and the view as GET shows it then; the journal's ids name the shipment.
func TestMovingAShipment(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, step: -1})
	key := e.copyOf(t, "sk_test_sandbox_all", "copy")
	rep := e.addEvents(t, key, "shp_sbx_unlabelled", `{"status":"out_for_delivery"}`, "m-1")
	if rep.status != 201 || rep.header.Get("Location") != "/v1/shipments/shp_sbx_unlabelled/tracking" ||
		string(rep.body) != `{"shipment_id":"shp_sbx_unlabelled","reference":"SBX-REF-1004","tracking_number":null,"status":"out_for_delivery","events":[{"status":"out_for_delivery","description":"Out for delivery","timestamp":"2026-11-22T12:00:00Z","location":""}]}` {
		t.Fatalf("the shorthand: %s %s", rep, rep.header)
	}
	if got := e.get(t, "/v1/shipments/shp_sbx_unlabelled/tracking", key); !bytes.Equal(got.body, rep.body) {
		t.Errorf("GET after the move: %s, the 201: %s", got.body, rep.body)
	}
	// Raw events: an offset other than Z, the stored event again (one), a duplicate within
	// the list (one), an event without an offset (left out), sent out of order.
	body := `{"events":[` +
		`{"timestamp":"2026-11-22T13:30:00+01:00","status":"failure","description":"Delivery attempted: no one in","location":"Leeds, GB"},` +
		`{"timestamp":"2026-11-22T12:00:00Z","status":"out_for_delivery","description":"Out for delivery","location":"elsewhere"},` +
		`{"timestamp":"2026-11-22T10:00:00","status":"in_transit","description":"Naive","location":"Leeds, GB"},` +
		`{"timestamp":"2026-11-22T09:00:00-03:00","status":"in_transit","description":"Departed facility","location":"Leeds, GB"},` +
		`{"timestamp":"2026-11-22T12:00:00Z","status":"in_transit","description":"Departed facility","location":"York, GB"}]}`
	v := viewOf(t, e.addEvents(t, key, "shp_sbx_unlabelled", body, "m-2"))
	var got []string
	for _, ev := range v.Events {
		got = append(got, ev.Timestamp+" "+ev.Status+" "+ev.Description+" "+ev.Location)
	}
	want := []string{ // 12:30 (13:30+01:00) is still to come at the request's instant
		"2026-11-22T12:00:00Z out_for_delivery Out for delivery ", // held: the stored one, not the one sent again
		"2026-11-22T12:00:00Z in_transit Departed facility Leeds, GB",
	}
	if !slices.Equal(got, want) || v.Status != "in_transit" {
		t.Errorf("the events after the raw ones: %s, status %s\nwant %s, status in_transit (its last shown event's: 12:30 is still to come)", strings.Join(got, "; "), v.Status, strings.Join(want, "; "))
	}
	if v := viewOf(t, e.get(t, "/v1/shipments/shp_sbx_unlabelled/tracking", key, "Prefer", `clock="2026-11-22T12:30:00Z"`)); v.Status != "failure" || len(v.Events) != 3 {
		t.Errorf("at 12:30: %+v", v)
	}
	// With its location; its entry names the shipment.
	v = viewOf(t, e.addEvents(t, key, "shp_sbx_pickup", `{"location":"York, GB","status":"delivered"}`, "m-3"))
	if last := v.Events[len(v.Events)-1]; v.Status != "delivered" || last.Description != "Delivered" || last.Location != "York, GB" {
		t.Errorf("the shorthand with a location: %+v", v)
	}
	j := e.journalOf(t, key, "")
	for _, entry := range j.Data[len(j.Data)-3:] {
		if entry.Status == 201 && strings.Join(entry.IDs, ",") != strings.TrimSuffix(strings.TrimPrefix(entry.Target, "/v1/test_helpers/shipments/"), "/events") {
			t.Errorf("the journal's entry of %s names %v", entry.Target, entry.IDs)
		}
	}
	for status, description := range shorthandDescriptions {
		if !slices.Contains(trackingStatuses, status) || description == "" || len(shorthandDescriptions) != len(trackingStatuses) {
			t.Errorf("the shorthand describes %q as %q: one description for each status of the vocabulary", status, description)
		}
	}
}

// TestShipmentEventsOnTheSandboxClock: an event after the request's instant is shown from its instant
// on, a timeline entry of kind event; a request judged at its own instant (Prefer: clock), as
// the post and as the reads, sees each event from its own instant only; a shipment created
// later is not found before its creation.
func TestShipmentEventsOnTheSandboxClock(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, step: -1})
	key := e.copyOf(t, "sk_test_sandbox_all", "copy")
	at := func(offset string) []string { return []string{"Prefer", `clock="start+` + offset + `"`} }
	rep := e.addEvents(t, key, "shp_sbx_unlabelled", `{"events":[{"status":"delivered","description":"Delivered","after":"2h"}]}`, "later", at("1h")...)
	if v := viewOf(t, rep); len(v.Events) != 0 || v.Status != "pre_transit" || rep.header.Get("Preference-Applied") != `clock="2026-11-22T13:00:00Z"` {
		t.Fatalf("an event two hours after the post's instant, in its 201: %+v %s", v, rep.header)
	}
	for offset, n := range map[string]int{"0s": 0, "1h": 0, "2h59m59s": 0, "3h": 1, "30h": 1} {
		if v := viewOf(t, e.get(t, "/v1/shipments/shp_sbx_unlabelled/tracking", key, at(offset)...)); len(v.Events) != n {
			t.Errorf("at start+%s: %d events, want %d", offset, len(v.Events), n)
		}
	}
	var tl timelineJSON
	strict(t, e.get(t, "/v1/test_helpers/timeline", key, at("2h59m")...), &tl)
	found := false
	for _, en := range tl.ToCome {
		found = found || en.Kind == "event" && en.ID == "shp_sbx_unlabelled" && en.At == "2026-11-22T15:00:00Z" && en.Status != nil && *en.Status == "delivered"
	}
	if !found {
		t.Errorf("no timeline entry for the event to come: %+v", tl.ToCome)
	}
	// The boundary: an event at the request's instant is shown at once, no entry of what comes;
	// one a nanosecond after it is to come, an entry of the timeline.
	e.addEvents(t, key, "shp_sbx_pickup", `{"events":[{"status":"delivered","description":"At once","timestamp":"2026-11-22T17:00:00Z"},{"status":"delivered","description":"A nanosecond on","timestamp":"2026-11-22T17:00:00.000000001Z"}]}`, "boundary", at("5h")...)
	strict(t, e.get(t, "/v1/test_helpers/timeline", key, "Prefer", `clock="2026-11-22T16:59:59Z"`), &tl)
	var coming []string
	for _, en := range tl.ToCome {
		if en.ID == "shp_sbx_pickup" {
			coming = append(coming, en.At)
		}
	}
	if !slices.Equal(coming, []string{"2026-11-22T17:00:00.000000001Z"}) {
		t.Errorf("the entries to come of events at the request's instant and a nanosecond after: %v, want the second only", coming)
	}
	// A shipment created an hour on is not found before then.
	if rep := e.book(t, key, `{"id":"shp_later","reference":"L"}`, "book", at("1h")...); rep.status != 201 {
		t.Fatalf("the booking: %s", rep)
	}
	wantProblem(t, e.addEvents(t, key, "shp_later", `{"status":"delivered"}`, "early", at("30m")...), 404, "not_found", "")
	if rep := e.addEvents(t, key, "shp_later", `{"status":"delivered"}`, "in-time", at("1h")...); rep.status != 201 {
		t.Errorf("once created: %s", rep)
	}
}

// TestShipmentEventsRefusals: every refusal of the events' write, each in a request with a second
// fault that a later check would find: the earlier check answers, in the order of a booking's
// (route, method, declared size, key, live, rate, Idempotency-Key, Prefer, body size, the
// store, Prefer code, query, JSON, members in the order sent, the shipment, the write).
// Nothing refused is stored: the key of a refusal is free again.
func TestShipmentEventsRefusals(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, step: -1})
	key := e.copyOf(t, "sk_test_sandbox_all", "copy")
	other := e.copyOf(t, "sk_test_sandbox_all", "other")
	if rep := e.book(t, other, `{"id":"shp_theirs","reference":"T"}`, "theirs"); rep.status != 201 {
		t.Fatalf("another sandbox's shipment: %s", rep)
	}
	big := `{"status":"delivered","pad":"` + strings.Repeat("x", maxBodyBytes) + `"}`
	for i, tt := range []struct {
		name, key, id, body string
		headers             []string // nil: a fresh Idempotency-Key
		status              int
		code, param         string
	}{
		{"a PUT, without a key", "", "shp_sbx_spring", `{}`, []string{"Method", "PUT"}, 405, "method_not_allowed", ""},
		{"a body declared past 256 KiB, without a key", "", "shp_sbx_spring", big, nil, 413, "body_too_large", ""},
		{"no key, and no Idempotency-Key", "", "shp_sbx_spring", `{}`, []string{}, 401, "missing_api_key", ""},
		{"a live key, and no Idempotency-Key", "sk_live_sandbox_all", "shp_sbx_spring", `{}`, []string{}, 503, "live_not_released", ""},
		{"an empty Idempotency-Key, and a bad Prefer", key, "shp_sbx_spring", `{}`, []string{"Idempotency-Key", "", "Prefer", "code=999"}, 400, "invalid_idempotency_key", "Idempotency-Key"},
		{"a bad Prefer, and a bad body", key, "shp_sbx_spring", `[`, []string{"Prefer", "code=999"}, 422, "invalid_parameter", "Prefer"},
		{"Prefer code=503, and a bad body: nothing stored", key, "shp_nowhere", `[`, []string{"Prefer", "code=503"}, 503, "provider_unavailable", ""},
		{"a query parameter, and a bad body", key, "shp_sbx_spring/events?x=1#", `[`, nil, 422, "unknown_parameter", "x"},
		{"not JSON, and an unknown shipment", key, "shp_nowhere", `{"status":`, nil, 400, "malformed_json", ""},
		{"not one object", key, "shp_sbx_spring", `[]`, nil, 400, "malformed_json", ""},
		{"an unknown member, and an unknown shipment", key, "shp_nowhere", `{"state":"delivered"}`, nil, 422, "unknown_parameter", "state"},
		{"a member twice", key, "shp_sbx_spring", `{"status":"delivered","Status":"failure"}`, nil, 422, "invalid_parameter", "Status"},
		{"a status outside the vocabulary", key, "shp_sbx_spring", `{"status":"lost"}`, nil, 422, "invalid_parameter", "status"},
		{"both forms: the later named", key, "shp_sbx_spring", `{"events":[{"status":"delivered","description":"D"}],"status":"delivered"}`, nil, 422, "invalid_parameter", "status"},
		{"both forms, the other order", key, "shp_sbx_spring", `{"status":"delivered","events":[{"status":"delivered","description":"D"}]}`, nil, 422, "invalid_parameter", "events"},
		{"the value before the pair", key, "shp_sbx_spring", `{"events":[{"status":"lost","description":"D"}],"status":"delivered"}`, nil, 422, "invalid_parameter", "events[0].status"},
		{"neither form", key, "shp_sbx_spring", `{}`, nil, 422, "invalid_parameter", "events"},
		{"a location beside events", key, "shp_sbx_spring", `{"location":"Leeds, GB","events":[{"status":"delivered","description":"D"}]}`, nil, 422, "invalid_parameter", "location"},
		{"no events", key, "shp_sbx_spring", `{"events":[]}`, nil, 422, "invalid_parameter", "events"},
		{"101 events", key, "shp_sbx_spring", `{"events":[` + strings.Repeat(`{"status":"delivered","description":"D"},`, 100) + `{"status":"delivered","description":"D"}]}`, nil, 422, "invalid_parameter", "events"},
		{"an event without description", key, "shp_sbx_spring", `{"events":[{"status":"delivered"}]}`, nil, 422, "invalid_parameter", "events[0].description"},
		{"a timestamp and an after", key, "shp_sbx_spring", `{"events":[{"status":"delivered","description":"D","timestamp":"2026-11-22T12:00:00Z","after":"1h"}]}`, nil, 422, "invalid_parameter", "events[0].after"},
		{"an after that is no duration", key, "shp_sbx_spring", `{"events":[{"status":"delivered","description":"D"},{"status":"delivered","description":"D","after":"soon"}]}`, nil, 422, "invalid_parameter", "events[1].after"},
		{"an after past the year 9999", key, "shp_sbx_spring", `{"events":[{"status":"delivered","description":"D","after":"48h"}]}`, []string{"Prefer", `clock="9999-12-31T00:00:00Z"`}, 422, "invalid_parameter", "events[0].after"},
		{"a timestamp past the year 9999 in UTC", key, "shp_sbx_spring", `{"events":[{"status":"delivered","description":"D","timestamp":"9999-12-31T23:00:00-02:00"}]}`, nil, 422, "invalid_parameter", "events[0].timestamp"},
		{"a bad member, and an unknown shipment", key, "shp_nowhere", `{"status":"lost"}`, nil, 422, "invalid_parameter", "status"},
		{"an unknown shipment", key, "shp_nowhere", `{"status":"delivered"}`, nil, 404, "not_found", ""},
		{"another account's shipment", key, "shp_theirs", `{"status":"delivered"}`, nil, 404, "not_found", ""},
		{"a dataset's account: an unknown shipment first", "sk_test_sandbox_all", "shp_nowhere", `{"status":"delivered"}`, nil, 404, "not_found", ""},
		{"a dataset's account", "sk_test_sandbox_all", "shp_sbx_spring", `{"status":"delivered"}`, nil, 422, "capability_unavailable", ""},
	} {
		t.Run(caseName(tt.name), func(t *testing.T) {
			method := http.MethodPost
			headers := []string{"Content-Type", "application/json", "Idempotency-Key", "refused-" + strconv.Itoa(i)}
			switch {
			case tt.headers == nil:
			case len(tt.headers) == 0:
				headers = headers[:2]
			case tt.headers[0] == "Method":
				method = tt.headers[1]
			default:
				headers = append(headers, tt.headers...)
			}
			target := "/v1/test_helpers/shipments/" + tt.id + "/events"
			if path, ok := strings.CutSuffix(tt.id, "#"); ok { // the id holds the rest of the target
				target = "/v1/test_helpers/shipments/" + path
			}
			p := wantProblem(t, e.do(t, newBodyRequest(method, target, tt.key, tt.body, headers...)), tt.status, tt.code, tt.param)
			if tt.code == "capability_unavailable" && !strings.Contains(p.Detail, "make a sandbox") {
				t.Errorf("a dataset's account: the detail does not say to make a sandbox: %s", p.Detail)
			}
		})
	}
	if v := viewOf(t, e.get(t, "/v1/shipments/shp_sbx_spring/tracking", key)); len(v.Events) != 5 {
		t.Errorf("after the refusals shp_sbx_spring holds %d events, want its 5", len(v.Events))
	}
	if rep := e.addEvents(t, key, "shp_sbx_spring", `{"status":"delivered"}`, "refused-24"); rep.status != 201 { // the key of a refusal is free
		t.Errorf("a refusal's key again: %s", rep)
	}
}

// TestShipmentEventsIdempotency: the events' write is a write: a repeat after it is done answers its
// 201 again, byte for byte, and stores nothing more; the key with another body is 409
// idempotency_key_reused; a repeat while it runs, 409 idempotency_key_in_use; code=502
// stores the events and answers 502, its retry with the key the 201.
func TestShipmentEventsIdempotency(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, step: -1})
	key := e.copyOf(t, "sk_test_sandbox_all", "copy")
	first := e.addEvents(t, key, "shp_sbx_unlabelled", `{"status":"in_transit"}`, "k")
	again := e.addEvents(t, key, "shp_sbx_unlabelled", `{"status":"in_transit"}`, "k")
	if first.status != 201 || again.status != 201 || !bytes.Equal(first.body, again.body) || again.header.Get("Idempotent-Replayed") != "true" || again.header.Get("Location") != first.header.Get("Location") {
		t.Fatalf("a repeat: %s %s\nthe first: %s", again, again.header, first)
	}
	if v := viewOf(t, e.get(t, "/v1/shipments/shp_sbx_unlabelled/tracking", key)); len(v.Events) != 1 {
		t.Errorf("after a repeat: %d events, want 1", len(v.Events))
	}
	wantProblem(t, e.addEvents(t, key, "shp_sbx_unlabelled", `{"status":"delivered"}`, "k"), 409, "idempotency_key_reused", "")
	wantProblem(t, e.addEvents(t, key, "shp_sbx_pickup", `{"status":"in_transit"}`, "k"), 409, "idempotency_key_reused", "") // another path
	claimed, release := make(chan struct{}), make(chan struct{})
	e.srv.registry.hooks.claimed = func(_ *tenant, k string) {
		if k == "slow" {
			close(claimed)
			<-release
		}
	}
	slow := e.serveAsync(t, newBodyRequest(http.MethodPost, "/v1/test_helpers/shipments/shp_sbx_failed/events", key, `{"status":"delivered"}`, "Idempotency-Key", "slow"))
	<-claimed // the slow move holds its key in progress
	rep := e.addEvents(t, key, "shp_sbx_failed", `{"status":"delivered"}`, "slow")
	wantProblem(t, rep, 409, "idempotency_key_in_use", "")
	if rep.header.Get("Retry-After") != "1" {
		t.Errorf("in use without Retry-After: 1: %s", rep.header)
	}
	close(release)
	if rep := within(t, "the slow move", slow); rep.status != 201 {
		t.Errorf("the slow move: %s", rep)
	}
	unconfirmed := e.addEvents(t, key, "shp_sbx_cancelled", `{"status":"delivered"}`, "u", "Prefer", "code=502")
	wantProblem(t, unconfirmed, 502, "provider_not_confirmed", "")
	if v := viewOf(t, e.get(t, "/v1/shipments/shp_sbx_cancelled/tracking", key)); v.Status != "delivered" {
		t.Errorf("after a 502 the events are stored: %s", v.Status)
	}
	if rep := e.addEvents(t, key, "shp_sbx_cancelled", `{"status":"delivered"}`, "u"); rep.status != 201 || rep.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the 502's retry: %s", rep)
	}
}

// TestShipmentEventsAtTheBound: a shipment holds at most 1,000 events: the events that would take it
// past are refused, 422 capability_unavailable, and none of them is stored; an event it
// holds again is no event more.
func TestShipmentEventsAtTheBound(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, step: -1})
	key := e.copyOf(t, "sk_test_sandbox_all", "copy")
	events := func(from, n int) string {
		var list []string
		for i := from; i < from+n; i++ {
			list = append(list, fmt.Sprintf(`{"timestamp":"2026-11-01T00:00:00Z","status":"in_transit","description":"Scan %d"}`, i))
		}
		return `{"events":[` + strings.Join(list, ",") + `]}`
	}
	for round := range maxShipmentEvents / maxPostedEvents {
		if rep := e.addEvents(t, key, "shp_sbx_unlabelled", events(round*maxPostedEvents, maxPostedEvents), fmt.Sprint("r-", round)); rep.status != 201 {
			t.Fatalf("round %d: %s", round, rep)
		}
	}
	p := wantProblem(t, e.addEvents(t, key, "shp_sbx_unlabelled", events(maxShipmentEvents-1, 2), "past"), 422, "capability_unavailable", "")
	if !strings.Contains(p.Detail, "would hold 1001, past the 1000 a shipment holds: nothing was stored") {
		t.Errorf("the bound's detail: %s", p.Detail)
	}
	if rep := e.addEvents(t, key, "shp_sbx_unlabelled", events(0, 5), "held"); rep.status != 201 || len(viewOf(t, rep).Events) != maxShipmentEvents {
		t.Errorf("events it holds, at the bound: %s", rep.String()[:100])
	}
}

// TestShipmentEventsRacingReads: 200 posts of one event each to one shipment, at once, beside readers
// of its view (run with -race): every post is stored exactly once, and every view read is
// whole: well-formed, oldest first, each event once, its status its last event's, never
// fewer events than a read before it.
func TestShipmentEventsRacingReads(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, step: -1, quiet: true})
	key := e.copyOf(t, "sk_test_sandbox_all", "copy")
	const posts = 200
	var wg sync.WaitGroup
	done := make(chan struct{})
	var faults atomic.Int64
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			seen := 0
			for {
				select {
				case <-done:
					return
				default:
				}
				rep := e.do(t, newRequest(http.MethodGet, "/v1/shipments/shp_sbx_unlabelled/tracking", key))
				var v trackingView
				if json.Unmarshal(rep.body, &v) != nil || len(v.Events) < seen || !slices.IsSortedFunc(v.Events, func(a, b trackingEvent) int { return strings.Compare(a.Timestamp, b.Timestamp) }) ||
					len(v.Events) > 0 && v.Status != v.Events[len(v.Events)-1].Status {
					faults.Add(1)
				}
				seen = len(v.Events)
			}
		}()
	}
	var writers sync.WaitGroup
	for i := range posts {
		writers.Add(1)
		go func() {
			defer writers.Done()
			status := []string{"in_transit", "out_for_delivery", "failure"}[i%3]
			body := fmt.Sprintf(`{"events":[{"timestamp":"2026-11-20T%02d:%02d:00Z","status":%q,"description":"Scan %d"}]}`, i/60, i%60, status, i)
			if rep := e.addEvents(t, key, "shp_sbx_unlabelled", body, fmt.Sprint("p-", i)); rep.status != 201 {
				t.Errorf("post %d: %s", i, rep)
			}
		}()
	}
	writers.Wait()
	close(done)
	wg.Wait()
	if n := faults.Load(); n > 0 {
		t.Errorf("%d views read were not whole", n)
	}
	v := viewOf(t, e.get(t, "/v1/shipments/shp_sbx_unlabelled/tracking", key))
	descriptions := map[string]bool{}
	for _, ev := range v.Events {
		descriptions[ev.Description] = true
	}
	if len(v.Events) != posts || len(descriptions) != posts {
		t.Errorf("%d events, %d descriptions: want each of the %d posts stored once", len(v.Events), len(descriptions), posts)
	}
}

// TestShipmentEventsRacingTheirDelete: posts to a sandbox's shipment sent at once with its DELETE:
// each post is stored (201) or answers 401 invalid_api_key, never anything else, and the
// DELETE 204; afterwards the registry holds nothing of the sandbox.
func TestShipmentEventsRacingTheirDelete(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, step: -1, quiet: true})
	for round := range 50 {
		_, sb := e.postSandbox(t, "sk_test_sandbox_all", `{}`, fmt.Sprint("race-", round))
		key := sb.Keys[0].Key
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rep := e.addEvents(t, key, "shp_sbx_unlabelled", `{"status":"delivered"}`, fmt.Sprint("m-", i))
				if rep.status != 201 && !(rep.status == 401 && bytes.Contains(rep.body, []byte(`"code":"invalid_api_key"`))) {
					t.Errorf("a post racing its sandbox's DELETE: %s", rep)
				}
			}()
		}
		if rep := e.do(t, newRequest(http.MethodDelete, "/v1/test_helpers/sandboxes/"+sb.Account, key)); rep.status != 204 {
			t.Errorf("the DELETE: %s", rep)
		}
		wg.Wait()
	}
	if h := sandboxHoldings(e); h != (holdings{}) {
		t.Errorf("the registry holds %+v of the deleted sandboxes", h)
	}
}

// FuzzShipmentEventsBody: whatever the body of an events' post, it is read without a panic: events
// it returns are each of the vocabulary with a description, 1 to 100, or a problem of 400
// or 422.
func FuzzShipmentEventsBody(f *testing.F) {
	for _, seed := range []string{`{"status":"delivered"}`, `{"status":"delivered","location":"Leeds"}`, `{"events":[{"status":"delivered","description":"D","after":"2h"}]}`,
		`{"events":[{"status":"in_transit","description":"D","timestamp":"2026-11-22T12:00:00+01:00"}]}`, `{}`, `[]`, `{"events":[],"status":"x"}`, `{"location":null}`} {
		f.Add([]byte(seed))
	}
	at := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, body []byte) {
		raw, err := readShipmentEvents(body, at)
		if err != nil {
			if e := asAPIError(err); e == nil || e.status() != 400 && e.status() != 422 {
				t.Fatalf("%q: %v", body, err)
			}
			return
		}
		if len(raw) == 0 || len(raw) > maxPostedEvents {
			t.Fatalf("%q: %d events", body, len(raw))
		}
		for _, e := range raw {
			if !slices.Contains(trackingStatuses, e.Status) || e.Description == nil {
				t.Fatalf("%q: an event %+v", body, e)
			}
		}
	})
}

// BenchmarkShipmentEvents: one event posted to a shipment of a sandbox of 10,000 shipments
// (the contract: at most 2 ms, median), the shorthand and a list of 100; each shipment of the
// sandbox moved in turn, so that none nears its bound.
func BenchmarkShipmentEvents(b *testing.B) {
	e := benchEnvOf(b, bigMovingDataset(maxSandboxShipments), 0, time.Now().Add(-time.Hour))
	var hundred []string
	for i := range maxPostedEvents {
		hundred = append(hundred, fmt.Sprintf(`{"after":"-%ds","status":"in_transit","description":"Scan %d","location":"Leeds, GB"}`, i+1, i))
	}
	for _, tt := range []struct{ name, body string }{{"shorthand", `{"status":"out_for_delivery","location":"Leeds, GB"}`}, {"hundred_events", `{"events":[` + strings.Join(hundred, ",") + `]}`}} {
		b.Run(tt.name, func(b *testing.B) {
			benchBookings(b, func() string { return benchSandbox(b, e, "sk_test_moving_all") }, maxSandboxShipments, func(key string, i int) {
				w := &benchWriter{h: http.Header{}}
				e.h.ServeHTTP(w, newBodyRequest(http.MethodPost, fmt.Sprintf("/v1/test_helpers/shipments/shp_%05d/events", i), key, tt.body, "Idempotency-Key", strconv.Itoa(i)))
				if w.status != http.StatusCreated {
					b.Fatalf("%d %s", w.status, w.buf)
				}
			})
		})
	}
}

// BenchmarkReadsBesideShipmentEvents: GET by id of a dataset's order and shipment, alone and while a
// goroutine posts events to a sandbox of 10,000 shipments, 100 a second (a test suite that
// moves its parcels) or as fast as it can (one of the two cores given to moves): the reads
// take no lock a move takes (each tenant's data is a version swapped in whole); what they
// share with the moves is the machine, and its collector.
func BenchmarkReadsBesideShipmentEvents(b *testing.B) {
	e := benchEnvOf(b, bigMovingDataset(maxSandboxShipments), 0, time.Now().Add(-time.Hour))
	key := benchSandbox(b, e, "sk_test_moving_all")
	for _, pace := range []struct {
		name  string
		every time.Duration // between two posts; -1: none; 0: as fast as it can
	}{{"alone", -1}, {"beside_100_moves_a_second", 10 * time.Millisecond}, {"beside_moves_at_full_speed", 0}} {
		for _, target := range []string{"/v1/orders/ord_sbx_0001", "/v1/shipments/shp_sbx_spring/tracking"} {
			b.Run(pace.name+target, func(b *testing.B) {
				stop := make(chan struct{})
				var moving sync.WaitGroup
				if pace.every >= 0 {
					moving.Add(1)
					go func() {
						defer moving.Done()
						tick := time.NewTicker(max(pace.every, time.Microsecond))
						defer tick.Stop()
						for i := 0; ; i++ {
							select {
							case <-stop:
								return
							case <-tick.C:
							}
							w := &benchWriter{h: http.Header{}}
							e.h.ServeHTTP(w, newBodyRequest(http.MethodPost, fmt.Sprintf("/v1/test_helpers/shipments/shp_%05d/events", i%maxSandboxShipments), key, `{"status":"in_transit"}`, "Idempotency-Key", fmt.Sprint(pace.name, target, i)))
						}
					}()
				}
				benchServe(b, e.h, newRequest(http.MethodGet, target, "sk_test_sandbox_all"), 200)
				close(stop)
				moving.Wait()
			})
		}
	}
}

// bigMovingDataset is the default dataset with an account of n shipments, acct_moving, whose
// copies the moves' benchmarks move.
func bigMovingDataset(n int) []byte {
	var ds map[string]any
	json.Unmarshal(defaultDataset, &ds)
	ds["accounts"] = append(ds["accounts"].([]any), map[string]any{"id": "acct_moving", "environments": []any{"test"}})
	ds["keys"] = append(ds["keys"].([]any), map[string]any{"key": "sk_test_moving_all", "account": "acct_moving", "environment": "test", "scopes": []any{"tracking:read", "orders:read"}})
	shipments := ds["shipments"].([]any)
	for i := range n {
		shipments = append(shipments, map[string]any{"id": fmt.Sprintf("shp_%05d", i), "account": "acct_moving", "environment": "test", "reference": fmt.Sprint("M-", i),
			"tracking_number": fmt.Sprintf("TM%05d", i), "events": []any{map[string]any{"after": "-2h", "status": "pre_transit", "description": "Label created", "location": "Leeds, GB"}}})
	}
	ds["shipments"] = shipments
	b, _ := json.Marshal(ds)
	return b
}

// ===== tracking.go: Normalizing raw carrier events, tracking views, the index, the two operations =====

// tracking.go: every fixture's tracking view, lookup by number, normalization.

func TestTrackingViewsOfEveryFixture(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	tests := []struct {
		name, target, key, want string
	}{
		{
			// UK clocks go forward at 01:00 UTC on 2026-03-29: 02:30+01:00 is 01:30Z.
			"spring DST instants kept in UTC", "/v1/shipments/shp_sbx_spring/tracking", "sk_test_sandbox_all",
			`{"shipment_id":"shp_sbx_spring","reference":"SBX-REF-1001","tracking_number":"SBX1000000001","status":"delivered","events":[` +
				`{"status":"pre_transit","description":"Label created","timestamp":"2026-03-28T18:00:00Z","location":"London, GB"},` +
				`{"status":"in_transit","description":"Departed facility","timestamp":"2026-03-29T00:30:00Z","location":"Heathrow, GB"},` +
				`{"status":"in_transit","description":"Arrived at hub","timestamp":"2026-03-29T01:30:00Z","location":"Birmingham, GB"},` +
				`{"status":"out_for_delivery","description":"Out for delivery","timestamp":"2026-03-29T08:15:00Z","location":"Manchester, GB"},` +
				`{"status":"delivered","description":"Delivered","timestamp":"2026-03-29T12:05:00Z","location":"Manchester, GB"}]}`,
		},
		{
			// Local 01:30 happens twice on 2026-10-25: 00:30Z and 01:30Z. The two exact
			// duplicates (00:30Z "Departed facility", the repeated 01:30Z event) are dropped.
			"autumn DST: two instants, duplicates suppressed", "/v1/shipments/shp_sbx_autumn/tracking", "sk_test_sandbox_all",
			`{"shipment_id":"shp_sbx_autumn","reference":"SBX-REF-1002","tracking_number":"SBX1000000002","status":"in_transit","events":[` +
				`{"status":"pre_transit","description":"Label created","timestamp":"2026-10-24T15:00:00Z","location":"Leeds, GB"},` +
				`{"status":"in_transit","description":"Departed facility","timestamp":"2026-10-25T00:30:00Z","location":"Leeds, GB"},` +
				`{"status":"in_transit","description":"Arrived at sort centre","timestamp":"2026-10-25T01:30:00Z","location":"York, GB"}]}`,
		},
		{
			// Three timestamps without an offset are not interpreted: only the 11:00+00:00
			// event is stored, so the status is in_transit, not delivered.
			"naive timestamps excluded", "/v1/shipments/shp_sbx_naive/tracking", "sk_test_sandbox_all",
			`{"shipment_id":"shp_sbx_naive","reference":"SBX-REF-1003","tracking_number":"SBX1000000003","status":"in_transit","events":[` +
				`{"status":"in_transit","description":"Departed facility","timestamp":"2026-11-20T11:00:00Z","location":"Bristol, GB"}]}`,
		},
		{
			"null tracking number, no events", "/v1/shipments/shp_sbx_unlabelled/tracking", "sk_test_sandbox_all",
			`{"shipment_id":"shp_sbx_unlabelled","reference":"SBX-REF-1004","tracking_number":null,"status":"pre_transit","events":[]}`,
		},
		{
			"twin a by id", "/v1/shipments/shp_sbx_twin_a/tracking", "sk_test_sandbox_tracking",
			`{"shipment_id":"shp_sbx_twin_a","reference":"SBX-REF-1005","tracking_number":"SBX2000000000","status":"in_transit","events":[` +
				`{"status":"in_transit","description":"In transit","timestamp":"2026-11-02T08:00:00Z","location":"Leicester, GB"}]}`,
		},
		{
			"twin b by id", "/v1/shipments/shp_sbx_twin_b/tracking", "sk_test_sandbox_all",
			`{"shipment_id":"shp_sbx_twin_b","reference":"SBX-REF-1006","tracking_number":"SBX2000000000","status":"in_transit","events":[` +
				`{"status":"in_transit","description":"In transit","timestamp":"2026-11-02T08:00:00Z","location":"Leicester, GB"}]}`,
		},
		{
			"multi-parcel, null location is empty", "/v1/shipments/shp_sbx_parcels/tracking", "sk_test_sandbox_all",
			`{"shipment_id":"shp_sbx_parcels","reference":"SBX-REF-1007","tracking_number":"SBX3000000001","status":"in_transit","events":[` +
				`{"status":"pre_transit","description":"Shipment information received","timestamp":"2026-11-03T07:00:00Z","location":""},` +
				`{"status":"in_transit","description":"In transit","timestamp":"2026-11-03T15:00:00Z","location":"Glasgow, GB"}]}`,
		},
		{
			"another account's own shipment", "/v1/shipments/shp_other_1/tracking", "sk_test_other_all",
			`{"shipment_id":"shp_other_1","reference":"OTH-REF-1","tracking_number":"SBX1000000001","status":"delivered","events":[` +
				`{"status":"delivered","description":"Delivered","timestamp":"2026-10-14T10:00:00Z","location":"Cardiff, GB"}]}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := e.get(t, tt.target, tt.key)
			if rep.status != 200 || string(rep.body) != tt.want {
				t.Errorf("GET %s = %s\nwant 200 %s", tt.target, rep, tt.want)
			}
		})
	}
}

func TestTrackingByNumber(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	tests := []struct {
		name, number, key string
		wantStatus        int
		wantShipment      string
	}{
		{"primary number", "SBX1000000001", "sk_test_sandbox_all", 200, "shp_sbx_spring"},
		{"same number, the other account finds its own", "SBX1000000001", "sk_test_other_all", 200, "shp_other_1"},
		{"autumn", "SBX1000000002", "sk_test_sandbox_tracking", 200, "shp_sbx_autumn"},
		{"naive", "SBX1000000003", "sk_test_sandbox_all", 200, "shp_sbx_naive"},
		{"multi-parcel primary", "SBX3000000001", "sk_test_sandbox_all", 200, "shp_sbx_parcels"},
		{"further parcel does not match", "SBX3000000002", "sk_test_sandbox_all", 404, ""},
		{"third parcel does not match", "SBX3000000003", "sk_test_sandbox_all", 404, ""},
		{"ambiguous number is 404 in the sandbox", "SBX2000000000", "sk_test_sandbox_all", 404, ""},
		{"live shipment's number with a test key", "SBX9000000001", "sk_test_sandbox_all", 404, ""},
		{"unknown number", "SBX0000000000", "sk_test_sandbox_all", 404, ""},
		{"exact match: lower case differs", "sbx1000000001", "sk_test_sandbox_all", 404, ""},
		{"exact match: a prefix differs", "SBX100000000", "sk_test_sandbox_all", 404, ""},
		{"other account cannot see the twins", "SBX2000000000", "sk_test_other_all", 404, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := e.get(t, "/v1/tracking/"+tt.number, tt.key)
			if tt.wantStatus == 404 {
				wantProblem(t, rep, 404, "not_found", "")
				return
			}
			byID := e.get(t, "/v1/shipments/"+tt.wantShipment+"/tracking", tt.key)
			if rep.status != 200 || !bytes.Equal(rep.body, byID.body) {
				t.Errorf("GET /v1/tracking/%s = %s\nwant the view of %s: %s", tt.number, rep, tt.wantShipment, byID.body)
			}
		})
	}
}

// sharedNumber is a dataset whose acct_a/test has shipments holding tracking number N:
// one created at each of created ("" for one that always existed), in that order.
func sharedNumber(created ...string) []byte {
	var ships []string
	for i, at := range created {
		s := fmt.Sprintf(`{"id":"shp_%d","account":"acct_a","environment":"test","reference":"S","tracking_number":"N"`, i)
		if at != "" {
			s += `,"created_at":"` + at + `"`
		}
		ships = append(ships, s+"}")
	}
	key := `{"key":"sk_test_a","account":"acct_a","environment":"test","scopes":["tracking:read"]}`
	return []byte(dataset(dsAccounts, key, strings.Join(ships, ","), ""))
}

// TestASharedNumberAtEachInstant: a number is found while exactly one shipment found then
// holds it (the first created, whatever the dataset's order), and is ambiguous (404) from
// the second's creation on.
func TestASharedNumberAtEachInstant(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		created []string
		at      map[string]string // instant -> the shipment found, "" for a 404
	}{
		{"created out of order", []string{"start+30s", "start+10s", "start+20s"},
			map[string]string{"start+9s": "", "start+10s": "shp_1", "start+19.999s": "shp_1", "start+20s": "", "start+1h": ""}},
		{"one always there", []string{"start+10s", ""}, map[string]string{"start-1h": "shp_1", "start+9s": "shp_1", "start+10s": ""}},
		{"two created at once", []string{"start+10s", "start+10s"}, map[string]string{"start+9s": "", "start+10s": ""}},
		{"one holder", []string{"start+10s"}, map[string]string{"start": "", "start+10s": "shp_0"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, envOptions{data: sharedNumber(tt.created...), rate: -1})
			for at, want := range tt.at {
				instant, _ := parseInstant(at, testNow)
				rep := e.get(t, "/v1/tracking/N", "sk_test_a", "Prefer", `clock="`+formatTimestamp(instant)+`"`)
				if got := ""; rep.status == 200 {
					got = shipmentOf(t, rep)
					if got != want {
						t.Errorf("at %s GET /v1/tracking/N finds %s, want %q", at, got, want)
					}
				} else if want != "" || rep.status != 404 {
					t.Errorf("at %s GET /v1/tracking/N = %s, want %q", at, rep, want)
				}
			}
		})
	}
}

// shipmentOf is the shipment_id of a tracking view.
func shipmentOf(t *testing.T, rep reply) string {
	t.Helper()
	var v struct {
		ShipmentID string `json:"shipment_id"`
	}
	if err := json.Unmarshal(rep.body, &v); err != nil {
		t.Fatal(err)
	}
	return v.ShipmentID
}

// sharedNumberLater is sharedNumber of n shipments, the first 20 always there, the rest
// created a day after the start: the red team's arrangement.
func sharedNumberLater(n int) []byte {
	created := make([]string, n)
	for i := 20; i < n; i++ {
		created[i] = "start+24h"
	}
	return sharedNumber(created...)
}

// TestASharedNumberCostsWhatAnyNumberCosts: a lookup by a number that 100,000 shipments
// hold (the first 20 always there, the rest created a day after the start) costs what a
// lookup of a number one shipment holds costs, as the red team set it: walking the
// shipments that hold it cost 16 ms a lookup, some 8,000 times one holder's. The fastest of
// three runs of each.
func TestASharedNumberCostsWhatAnyNumberCosts(t *testing.T) { // not parallel: it compares two timings
	lookups := func(data []byte) time.Duration {
		e := newEnv(t, envOptions{data: data, rate: -1, quiet: true})
		r := newRequest(http.MethodGet, "/v1/tracking/N", "sk_test_a")
		best := time.Hour
		for range 3 {
			start := time.Now()
			for range 1000 {
				e.h.ServeHTTP(httptest.NewRecorder(), r)
			}
			best = min(best, time.Since(start))
		}
		return best
	}
	many, one := lookups(sharedNumberLater(100000)), lookups(sharedNumber(""))
	if many > 50*one { // walking the holders costs thousands of times more; a busy machine, a share
		t.Errorf("1,000 lookups of a number 100,000 shipments hold take %v, of a number one holds %v: want about the same, at most 50 times", many, one)
	}
}

func TestNormalizeEvents(t *testing.T) {
	t.Parallel()
	ev := func(ts any, status, desc string, loc *string) rawEvent {
		text, isString := ts.(string)
		return rawEvent{Timestamp: jsonScalar{given: ts != nil, isString: isString, text: text}, Status: status, Description: &desc, Location: loc}
	}
	here := "Here, GB"
	raw := []rawEvent{
		ev("2026-11-20T12:00:00Z", "delivered", "Delivered", &here),
		ev("2026-11-20T10:00:00+00:00", "in_transit", "Same instant", nil),
		ev("2026-11-20T11:00:00+01:00", "in_transit", "Same instant", &here), // 10:00Z again: a duplicate
		ev("2026-11-20T10:00:00Z", "in_transit", "Another description", &here),
		ev("2026-11-20T11:00:00Z", "in_transit", "Same instant", &here), // same description, another instant
		ev("2026-11-20T09:00:00", "in_transit", "Naive", &here),
		ev(1763629200, "in_transit", "A number", &here),
		ev(nil, "in_transit", "Null", &here),
		{Status: "in_transit", Description: &here},                                                                             // no timestamp at all
		{Status: "out_for_delivery", Description: &here, scheduled: true, at: time.Date(2026, 11, 20, 11, 30, 0, 0, time.UTC)}, // scheduled with after
		{Status: "out_for_delivery", Description: &here, scheduled: true, at: time.Date(2026, 11, 20, 11, 30, 0, 0, time.UTC)}, // the same again: a duplicate
		ev("2026-11-20T11:30:00Z", "out_for_delivery", "Other", &here),                                                         // the same instant as the scheduled one: after it, as sent
	}
	stamped, n := normalizeEvents(raw)
	var events []trackingEvent
	for _, e := range stamped {
		events = append(events, e.trackingEvent)
	}
	want := []trackingEvent{
		{"in_transit", "Same instant", "2026-11-20T10:00:00Z", ""},
		{"in_transit", "Another description", "2026-11-20T10:00:00Z", "Here, GB"},
		{"in_transit", "Same instant", "2026-11-20T11:00:00Z", "Here, GB"},
		{"out_for_delivery", "Here, GB", "2026-11-20T11:30:00Z", ""},
		{"out_for_delivery", "Other", "2026-11-20T11:30:00Z", "Here, GB"},
		{"delivered", "Delivered", "2026-11-20T12:00:00Z", "Here, GB"},
	}
	if !slices.Equal(events, want) || n.dropped != 4 || n.duplicates != 2 {
		t.Errorf("normalizeEvents = %+v, %+v\nwant %+v, 4 dropped, 2 duplicates", events, n, want)
	}
}

// TestRawEventsAreDroppedNotRefused: an event whose timestamp cannot be interpreted is
// dropped, the rest load, and start-up logs how many were dropped per shipment.
func TestRawEventsAreDroppedNotRefused(t *testing.T) {
	t.Parallel()
	data := dataset(dsAccounts, `{"key":"sk_test_a","account":"acct_a","environment":"test","scopes":["tracking:read"]}`,
		`{"id":"shp_1","account":"acct_a","environment":"test","reference":"S1","tracking_number":"T1","events":[`+
			`{"timestamp":"2026-11-01T00:00:00","status":"in_transit","description":"naive"},`+
			`{"timestamp":12345,"status":"in_transit","description":"a number"},`+
			`{"status":"in_transit","description":"none"},`+
			`{"timestamp":"2026-11-01T09:00:00+09:00","status":"delivered","description":"kept"}]}`, "")
	e := newEnv(t, envOptions{data: []byte(data)})
	want := `{"shipment_id":"shp_1","reference":"S1","tracking_number":"T1","status":"delivered","events":[{"status":"delivered","description":"kept","timestamp":"2026-11-01T00:00:00Z","location":""}]}`
	if rep := e.get(t, "/v1/shipments/shp_1/tracking", "sk_test_a"); string(rep.body) != want {
		t.Errorf("tracking view = %s, want %s", rep, want)
	}
	if !strings.Contains(e.logs.String(), `"msg":"dataset: raw events dropped: timestamp not RFC 3339 with an offset","shipment":"shp_1","tenant":"acct_a/test","dropped":3`) {
		t.Errorf("start-up log does not say 3 events of shp_1 were dropped:\n%s", e.logs)
	}
}

func BenchmarkTrackingByID(b *testing.B) {
	benchServe(b, benchEnv(b, 0).h, newRequest("GET", "/v1/shipments/shp_sbx_spring/tracking", "sk_test_sandbox_all"), 200)
}

func BenchmarkTrackingByNumber(b *testing.B) {
	benchServe(b, benchEnv(b, 0).h, newRequest("GET", "/v1/tracking/SBX1000000001", "sk_test_sandbox_all"), 200)
}

// ===== orders.go: Loading, the index, the query, pages and the two operations =====

// orders.go: orders, the query, pages and the index behind them.

func TestOrdersOfTheDefaultDataset(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	tests := []struct {
		target, key, want string
	}{
		{"/v1/orders/ord_sbx_0001", "sk_test_sandbox_all", sandboxOrderJSON},
		{"/v1/orders/ord_sbx_0001", "sk_test_sandbox_orders", sandboxOrderJSON},
		// Linked at load: shp_other_1 was created with order_id ord_other_0001.
		{"/v1/orders/ord_other_0001", "sk_test_other_all", otherOrderJSON},
		{"/v1/orders", "sk_test_sandbox_all", `{"data":[` + sandboxOrderJSON + `],"pagination":{"limit":20,"next_cursor":null,"has_more":false}}`},
		{"/v1/orders", "sk_test_other_all", `{"data":[` + otherOrderJSON + `],"pagination":{"limit":20,"next_cursor":null,"has_more":false}}`},
		{"/v1/orders?limit=1", "sk_test_sandbox_all", `{"data":[` + sandboxOrderJSON + `],"pagination":{"limit":1,"next_cursor":null,"has_more":false}}`},
		{"/v1/orders?status=unfulfilled&created_from=2026-11-01T09:30:00Z&created_to=2026-11-01T09:30:00Z", "sk_test_sandbox_all", `{"data":[` + sandboxOrderJSON + `],"pagination":{"limit":20,"next_cursor":null,"has_more":false}}`},
		{"/v1/orders?created_from=2026-11-01T10:30:00%2B01:00&created_to=2026-11-01T09:30:00Z", "sk_test_sandbox_all", `{"data":[` + sandboxOrderJSON + `],"pagination":{"limit":20,"next_cursor":null,"has_more":false}}`},
		{"/v1/orders?limit=0100", "sk_test_sandbox_all", `{"data":[` + sandboxOrderJSON + `],"pagination":{"limit":100,"next_cursor":null,"has_more":false}}`},
		{"/v1/orders?limit=001", "sk_test_sandbox_all", `{"data":[` + sandboxOrderJSON + `],"pagination":{"limit":1,"next_cursor":null,"has_more":false}}`},
		{"/v1/orders?status=fulfilled", "sk_test_sandbox_all", `{"data":[],"pagination":{"limit":20,"next_cursor":null,"has_more":false}}`},
		{"/v1/orders?created_from=2026-11-01T09:30:00.000000001Z", "sk_test_sandbox_all", `{"data":[],"pagination":{"limit":20,"next_cursor":null,"has_more":false}}`},
		{"/v1/orders?created_to=2026-11-01T09:29:59.999Z", "sk_test_sandbox_all", `{"data":[],"pagination":{"limit":20,"next_cursor":null,"has_more":false}}`},
	}
	for _, tt := range tests {
		t.Run(caseName(tt.target+" "+tt.key), func(t *testing.T) {
			rep := e.get(t, tt.target, tt.key)
			if rep.status != 200 || string(rep.body) != tt.want {
				t.Errorf("GET %s (%s) = %s\nwant 200 %s", tt.target, tt.key, rep, tt.want)
			}
		})
	}
}

// TestNoMarketplaceSecretsInResponses: the stored orders carry a marketplace token and raw
// marketplace data; no response of any operation shows any part of either.
func TestNoMarketplaceSecretsInResponses(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{seed: 50})
	var secrets []string
	var file struct {
		Orders []struct {
			ID                 string          `json:"id"`
			MarketplaceToken   string          `json:"marketplace_token"`
			RawMarketplaceData json.RawMessage `json:"raw_marketplace_data"`
		} `json:"orders"`
	}
	if err := json.Unmarshal(defaultDataset, &file); err != nil {
		t.Fatal(err)
	}
	for _, o := range file.Orders {
		if o.MarketplaceToken == "" || len(o.RawMarketplaceData) == 0 {
			t.Fatalf("order %s carries no marketplace token or raw data: the test proves nothing", o.ID)
		}
		secrets = append(secrets, o.MarketplaceToken, "buyer", "line_items", "receipt", "AmazonOrderId", "5550001001", "raw", "token", "marketplace")
	}
	targets := []string{"/v1/orders", "/v1/orders?limit=100", "/v1/orders/ord_sbx_0001", "/v1/orders/ord_other_0001", "/v1/shipments/shp_other_1/tracking"}
	for _, key := range []string{"sk_test_sandbox_all", "sk_test_other_all", "sk_live_sandbox_all"} {
		for _, target := range targets {
			rep := e.get(t, target, key)
			for _, s := range secrets {
				if bytes.Contains(bytes.ToLower(rep.body), bytes.ToLower([]byte(s))) {
					t.Errorf("GET %s (%s) shows %q: %s", target, key, s, rep.body)
				}
			}
		}
	}
	var order map[string]any
	if err := json.Unmarshal(e.get(t, "/v1/orders/ord_sbx_0001", "sk_test_sandbox_all").body, &order); err != nil {
		t.Fatal(err)
	}
	var fields []string
	for k := range order {
		fields = append(fields, k)
	}
	slices.Sort(fields)
	if want := []string{"created_at", "id", "merchant_reference", "platform", "shipment_id", "status"}; !slices.Equal(fields, want) {
		t.Errorf("order fields = %v, want exactly the spec's %v", fields, want)
	}
}

func TestOrderQueryValidation(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	tests := []struct {
		query  string
		status int
		code   string
		param  string
	}{
		{"limit=0", 422, "invalid_parameter", "limit"},
		{"limit=101", 422, "invalid_parameter", "limit"},
		{"limit=abc", 422, "invalid_parameter", "limit"},
		{"limit=", 422, "invalid_parameter", "limit"},
		{"limit", 422, "invalid_parameter", "limit"},
		{"limit=-1", 422, "invalid_parameter", "limit"},
		{"limit=+5", 422, "invalid_parameter", "limit"},
		{"limit=%2B5", 422, "invalid_parameter", "limit"},
		{"limit=5.0", 422, "invalid_parameter", "limit"},
		{"limit=1e2", 422, "invalid_parameter", "limit"},
		{"limit=%205", 422, "invalid_parameter", "limit"},
		{"limit=99999999999999999999999", 422, "invalid_parameter", "limit"},
		{"limit=5&limit=5", 422, "invalid_parameter", "limit"},
		{"status=shipped", 422, "invalid_parameter", "status"},
		{"status=", 422, "invalid_parameter", "status"},
		{"status=FULFILLED", 422, "invalid_parameter", "status"},
		{"status=fulfilled&status=cancelled", 422, "invalid_parameter", "status"},
		{"created_from=2026-11-20T10:00:00", 422, "invalid_parameter", "created_from"},
		{"created_from=2026-11-20%2010:00:00Z", 422, "invalid_parameter", "created_from"},
		{"created_from=2026-11-20", 422, "invalid_parameter", "created_from"},
		{"created_from=", 422, "invalid_parameter", "created_from"},
		{"created_from=yesterday", 422, "invalid_parameter", "created_from"},
		{"created_from=1700000000", 422, "invalid_parameter", "created_from"},
		{"created_to=2026-11-20T1:30:00Z", 422, "invalid_parameter", "created_to"},
		{"created_to=2026-11-20T24:00:00Z", 422, "invalid_parameter", "created_to"},
		{"created_to=2026-12-31T23:59:60Z", 422, "invalid_parameter", "created_to"},
		{"created_to=2026-11-20T10:00:00%2B24:00", 422, "invalid_parameter", "created_to"},
		{"created_to=2026-02-29T10:00:00Z", 422, "invalid_parameter", "created_to"},
		{"created_to=2026-11-20T10:00:00Z&created_to=2026-11-21T10:00:00Z", 422, "invalid_parameter", "created_to"},
		{"created_from=2026-11-02T00:00:00Z&created_to=2026-11-01T00:00:00Z", 422, "invalid_parameter", "created_from"},
		{"created_from=2026-11-01T01:00:00%2B01:00&created_to=2026-11-01T00:00:00Z", 200, "", ""},
		{"page=2", 422, "unknown_parameter", "page"},
		{"offset=0", 422, "unknown_parameter", "offset"},
		{"Limit=5", 422, "unknown_parameter", "Limit"},
		{"api_key=sk_test_sandbox_all", 422, "unknown_parameter", "api_key"},
		{"limit=5&starting_after=ord_sbx_0001", 422, "unknown_parameter", "starting_after"},
		{"=5", 422, "unknown_parameter", ""},
		{"%zz=1", 422, "unknown_parameter", "%zz"},
		{"status=%zz", 422, "invalid_parameter", "status"},
		{"cursor=", 400, "invalid_cursor", "cursor"},
		{"cursor=garbage", 400, "invalid_cursor", "cursor"},
		{"cursor=a&cursor=b", 422, "invalid_parameter", "cursor"},
		{"limit=5&&&", 200, "", ""},
		{strings.Repeat("&", 10000), 200, "", ""},
		{"limit=0x10", 422, "invalid_parameter", "limit"},
		{"limit=%G0", 422, "invalid_parameter", "limit"},
		{"limit=5;status=fulfilled", 422, "invalid_parameter", "limit"},
		{"status=fulfilled%00", 422, "invalid_parameter", "status"},
		{"created_from=" + strings.Repeat("2", 10000), 422, "invalid_parameter", "created_from"},
		{"created_from=10000-01-01T00:00:00Z", 422, "invalid_parameter", "created_from"},
		{"status[]=fulfilled", 422, "unknown_parameter", "status[]"},
		{"%FF=1", 422, "unknown_parameter", "\ufffd"},
		// Each pair in the order sent, by its name and then by its value.
		{"foo=%zz&status=bogus", 422, "unknown_parameter", "foo"},
		{"status=bogus&foo=%zz", 422, "invalid_parameter", "status"},
		{"limit=%zz&foo=1", 422, "invalid_parameter", "limit"},
		{"%zz=1&limit=0", 422, "unknown_parameter", "%zz"},
		// A literal + is a space, as clients write it: an offset is sent as %2B.
		{"created_from=2026-11-01T10:30:00+01:00", 422, "invalid_parameter", "created_from"},
		{"status=un+fulfilled", 422, "invalid_parameter", "status"},
		{"limit=0001", 200, "", ""},
		{"limit=00000000000000000000100", 200, "", ""},
		{"limit=0000", 422, "invalid_parameter", "limit"},
		{"created_from=2026-11-01T09:30:00z&created_to=2026-11-01t09:30:00Z", 200, "", ""},
	}
	for _, tt := range tests {
		t.Run(caseName(tt.query[:min(len(tt.query), 60)]), func(t *testing.T) {
			rep := e.get(t, "/v1/orders?"+tt.query, "sk_test_sandbox_all")
			if tt.status == 200 {
				if rep.status != 200 {
					t.Fatalf("= %s, want 200", rep)
				}
				return
			}
			wantProblem(t, rep, tt.status, tt.code, tt.param)
		})
	}
	// A + that became a space is named, with what to send instead.
	for _, q := range []string{"created_from=2026-11-01T10:30:00+01:00", "created_to=2026-11-01T10:30:00.5+01:00"} {
		p := wantProblem(t, e.get(t, "/v1/orders?"+q, "sk_test_sandbox_all"), 422, "invalid_parameter", strings.Split(q, "=")[0])
		if !strings.Contains(p.Detail, "a query reads a literal + as a space. Send the + as %2B") || !strings.Contains(p.Detail, " in Z") {
			t.Errorf("%s: detail %q does not say to send + as %%2B or use Z", q, p.Detail)
		}
	}
	if p := wantProblem(t, e.get(t, "/v1/orders?created_from=2026-11-01%2010:30:00Z", "sk_test_sandbox_all"), 422, "invalid_parameter", "created_from"); strings.Contains(p.Detail, "%2B") {
		t.Errorf("a space for T is not a lost +: detail %q", p.Detail)
	}
	// The operations that take no parameters refuse any.
	for _, target := range []string{"/v1/orders/ord_sbx_0001?expand=shipment", "/v1/shipments/shp_sbx_spring/tracking?limit=1", "/v1/tracking/SBX1000000001?carrier=x"} {
		rep := e.get(t, target, "sk_test_sandbox_all")
		name := target[strings.Index(target, "?")+1 : strings.Index(target, "=")]
		wantProblem(t, rep, 422, "unknown_parameter", name)
	}
}

// TestListParamsAreOneTable: the parameters of GET /v1/orders are one table, which the
// README's list, the document's and the messages that name them follow.
func TestListParamsAreOneTable(t *testing.T) {
	t.Parallel()
	var names []string
	for _, p := range listParams {
		names = append(names, p.name)
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	table := regexp.MustCompile("(?s)\\| Parameter \\| Values \\|\n\\|---\\|---\\|\n(.*?)\n\n").FindSubmatch(readme)
	if table == nil {
		t.Fatal("the README has no table of GET /v1/orders's parameters")
	}
	var inReadme []string
	for _, row := range strings.Split(string(table[1]), "\n") {
		first, _, _ := strings.Cut(strings.TrimPrefix(row, "| "), " |")
		for _, m := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(first, -1) {
			inReadme = append(inReadme, m[1])
		}
	}
	doc := theOpenAPI(t)
	var inDocument []string
	for _, p := range asSlice(asMap(asMap(asMap(doc.root["paths"])["/orders"])["get"])["parameters"]) {
		if name := fmt.Sprint(doc.resolve(p)["name"]); name != "Prefer" {
			inDocument = append(inDocument, name)
		}
	}
	for what, list := range map[string][]string{"the README": inReadme, "the document": inDocument} {
		if !slices.Equal(slices.Sorted(slices.Values(list)), slices.Sorted(slices.Values(names))) {
			t.Errorf("%s lists the parameters %v, the table %v", what, list, names)
		}
	}
	e := newEnv(t, envOptions{rate: -1})
	if p := wantProblem(t, e.get(t, "/v1/orders?page=2", "sk_test_sandbox_all"), 422, "unknown_parameter", "page"); !strings.Contains(p.Detail, "takes limit, cursor, status, created_from and created_to.") {
		t.Errorf("the unknown parameter's detail is %q", p.Detail)
	}
	if !strings.Contains(errCursorFilters.detail, "Keep status, created_from and created_to the same") {
		t.Errorf("the cursor's filters are named %q", errCursorFilters.detail)
	}
}

// TestPaginationWalks walks seeded orders for every combination of filters: every order
// that matches appears once, in list order, and none that does not.
func TestPaginationWalks(t *testing.T) {
	t.Parallel()
	const seed = 1500
	e := newEnv(t, envOptions{seed: seed})
	const key = "sk_test_sandbox_all"

	all := e.walk(t, key, "", 100)
	if len(all) != seed+1 {
		t.Fatalf("walk saw %d orders, want %d seeded + ord_sbx_0001", len(all), seed+1)
	}
	seen := map[string]bool{}
	statuses, platforms, sharedInstants := map[string]int{}, map[string]int{}, 0
	for i, o := range all {
		if seen[o.ID] {
			t.Fatalf("order %s appears twice", o.ID)
		}
		seen[o.ID] = true
		statuses[o.Status]++
		platforms[o.Platform]++
		if i > 0 {
			prev := all[i-1]
			if o.CreatedAt == prev.CreatedAt {
				sharedInstants++
			}
			pt, _ := time.Parse(time.RFC3339Nano, prev.CreatedAt)
			ot, _ := time.Parse(time.RFC3339Nano, o.CreatedAt)
			if ot.After(pt) || ot.Equal(pt) && o.ID >= prev.ID {
				t.Fatalf("list order broken: %s (%s) after %s (%s)", o.ID, o.CreatedAt, prev.ID, prev.CreatedAt)
			}
		}
	}
	if len(statuses) != 4 || len(platforms) != 5 || sharedInstants == 0 {
		t.Fatalf("seeded orders: statuses %v, platforms %v, %d shared created_at: want every status, every platform and some ties", statuses, platforms, sharedInstants)
	}
	// Every listed order is the order GET /v1/orders/{id} shows, byte for byte.
	for _, o := range all[:50] {
		want, _ := json.Marshal(o)
		if got := e.get(t, "/v1/orders/"+o.ID, key); got.status != 200 || string(got.body) != string(want) {
			t.Fatalf("GET /v1/orders/%s = %s, want %s", o.ID, got, want)
		}
	}

	// Bounds are instants of existing orders, inside tie groups, so inclusivity and the id
	// tie-break are both at stake at each edge.
	var lo, hi string
	for i := 1; i < len(all); i++ {
		if all[i].CreatedAt == all[i-1].CreatedAt {
			if hi == "" && i > 200 {
				hi = all[i].CreatedAt
			} else if hi != "" && i > 900 {
				lo = all[i].CreatedAt
				break
			}
		}
	}
	hiT, _ := time.Parse(time.RFC3339, hi)
	hiOffset := hiT.In(time.FixedZone("", -5*3600)).Format(time.RFC3339) // the same instant, another offset
	for _, status := range []string{"", "unfulfilled", "partially_fulfilled", "fulfilled", "cancelled"} {
		for _, from := range []string{"", lo} {
			for _, to := range []string{"", hi, hiOffset} {
				var q []string
				if status != "" {
					q = append(q, "status="+status)
				}
				if from != "" {
					q = append(q, "created_from="+url.QueryEscape(from))
				}
				if to != "" {
					q = append(q, "created_to="+url.QueryEscape(to))
				}
				var want []string
				for _, o := range all {
					if (status == "" || o.Status == status) && (from == "" || o.CreatedAt >= from) && (to == "" || o.CreatedAt <= hi) {
						want = append(want, o.ID)
					}
				}
				for _, limit := range []int{7, 100} {
					got := ids(e.walk(t, key, strings.Join(q, "&"), limit))
					if !slices.Equal(got, want) {
						t.Errorf("walk %q limit %d: %d orders, want %d (first difference at %d)", q, limit, len(got), len(want), firstDifference(got, want))
					}
				}
			}
		}
	}
	// limit=1 over a small seed, and a limit that changes between pages.
	small := newEnv(t, envOptions{seed: 30})
	one := ids(small.walk(t, key, "", 1))
	if full := ids(small.walk(t, key, "", 100)); !slices.Equal(one, full) || len(full) != 31 {
		t.Errorf("limit=1 walk = %v, want %v (31 orders)", one, full)
	}
	p1 := decodePage(t, small.get(t, "/v1/orders?limit=3", key))
	p2 := decodePage(t, small.get(t, "/v1/orders?limit=10&cursor="+*p1.Pagination.NextCursor, key))
	if got, want := ids(append(p1.Data, p2.Data...)), one[:13]; !slices.Equal(got, want) {
		t.Errorf("pages of 3 then 10 = %v, want %v", got, want)
	}
	if p := decodePage(t, small.get(t, "/v1/orders", key)); len(p.Data) != 20 || p.Pagination.Limit != 20 || !p.Pagination.HasMore {
		t.Errorf("default page: %d orders, limit %d, has_more %v; want 20, 20, true", len(p.Data), p.Pagination.Limit, p.Pagination.HasMore)
	}
}

func TestSeedOrders(t *testing.T) {
	t.Parallel()
	seeded := func() *orderIndex {
		ix := newOrderIndex("acct_sandbox", "test", testNow)
		if err := ix.seedOrders(1000); err != nil {
			t.Fatal(err)
		}
		if err := ix.build(); err != nil {
			t.Fatal(err)
		}
		return &ix
	}
	a, b := seeded(), seeded()
	if !bytes.Equal(a.block, b.block) || !slices.Equal(a.records, b.records) {
		t.Fatal("seeding is not deterministic")
	}
	checkOrderIndex(t, a)
	if first, last := string(a.idOf(0)), string(a.idOf(999)); first != "ord_seed_0000999" || last != "ord_seed_0000000" {
		t.Errorf("seeded ids run %s..%s, want ord_seed_0000999 (newest)..ord_seed_0000000", first, last)
	}
	if _, err := loadBytes("test", defaultDataset, 10, testNow, slog.New(slog.DiscardHandler)); err != nil {
		t.Errorf("seeding the default dataset: %v", err)
	}
	clash := dataset(`{"id":"acct_sandbox","environments":["test"]}`, "", "", `{"id":"ord_seed_0000004","account":"acct_sandbox","environment":"test","merchant_reference":"R","platform":"ebay","status":"fulfilled","created_at":"2026-11-01T00:00:00Z"}`)
	if _, err := loadBytes("clash.json", []byte(clash), 5, testNow, slog.New(slog.DiscardHandler)); err == nil || err.Error() != `-seed-orders: order id "ord_seed_0000004" is already in the dataset` {
		t.Errorf("a dataset order with a seeded id = %v", err)
	}
}

// checkOrderIndex: every order is valid JSON that encoding/json would write the same way,
// in list order; each status list holds only its status, in list order, and together all
// orders; every id is found by the id table, and no other.
func checkOrderIndex(t testing.TB, ix *orderIndex) {
	t.Helper()
	for i := range ix.count() {
		var o map[string]any
		if err := json.Unmarshal(ix.resource(i), &o); err != nil {
			t.Fatalf("order %d is not JSON: %s", i, ix.resource(i))
		}
		if o["id"] != string(ix.idOf(i)) || o["status"] != orderStatuses[ix.records[i].status] || o["created_at"] != formatTimestamp(ix.createdAt(i)) {
			t.Fatalf("order %d's record does not match its JSON %s", i, ix.resource(i))
		}
		var fields orderJSON
		mustDecode(t, ix.resource(i), &fields)
		if want, _ := marshalJSON(fields); !bytes.Equal(ix.resource(i), want) {
			t.Fatalf("order %d is written %s, encoding/json writes %s", i, ix.resource(i), want)
		}
		if i > 0 && !ix.createdAt(i).Before(ix.createdAt(i-1)) && !(ix.createdAt(i).Equal(ix.createdAt(i-1)) && string(ix.idOf(i)) < string(ix.idOf(i-1))) {
			t.Fatalf("order %s comes after %s", ix.idOf(i), ix.idOf(i-1))
		}
		if got := ix.table.find(ix, string(ix.idOf(i))); got != i {
			t.Fatalf("the id table finds %s at %d, want %d", ix.idOf(i), got, i)
		}
	}
	if ix.table.find(ix, "no such order") != -1 {
		t.Fatal("the id table finds an order that does not exist")
	}
	// Each order is in its status's list, or, with a timeline, in the list of those that move.
	total := len(ix.timed)
	for s, list := range ix.byValue[0] {
		for k, i := range list {
			if int(ix.records[i].status) != s || ix.records[i].timed || k > 0 && list[k-1] >= i {
				t.Fatalf("the %s list holds order %d (%s) at %d", orderStatuses[s], i, orderStatuses[ix.records[i].status], k)
			}
		}
		total += len(list)
	}
	for k, i := range ix.timed {
		tl := ix.timelines[k]
		if !ix.records[i].timed || k > 0 && ix.timed[k-1] >= i || tl.first >= tl.end || ix.states[tl.first].from != dawn {
			t.Fatalf("order %d is at %d of those that move, with timeline %+v", i, k, tl)
		}
	}
	if total != ix.count() || len(ix.imports) != len(ix.timed) {
		t.Fatalf("the status lists and those that move hold %d orders, the list of all %d", total, ix.count())
	}
}

func TestOrderIndexOfSeededOrders(t *testing.T) {
	t.Parallel()
	sb, err := loadBytes("test", defaultDataset, 1000, testNow, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	for _, tn := range sb.tenants.list {
		checkOrderIndex(t, &tn.current().orders)
	}
}

// TestAppendJSONStringMatchesEncodingJSON: the hand-written encoding of orders and errors
// writes strings exactly as encoding/json does (with HTML escaping off).
// TestResourcesAreWrittenAsSpecified: the two resources written without encoding/json at
// answer time keep the spec's members in the spec's order. A tracking view is a prepared
// head then its events, which holds only while events is the view's last member; an order
// is appended by hand, member by member.
func TestResourcesAreWrittenAsSpecified(t *testing.T) {
	t.Parallel()
	view := reflect.TypeOf(trackingView{})
	var members []string
	for i := range view.NumField() {
		members = append(members, view.Field(i).Tag.Get("json"))
	}
	if want := []string{"shipment_id", "reference", "tracking_number", "status", "events"}; !slices.Equal(members, want) {
		t.Errorf("trackingView's members are %v, want the spec's %v, events last", members, want)
	}
	order := reflect.TypeOf(orderJSON{})
	members = nil
	for i := range order.NumField() {
		members = append(members, strings.TrimSuffix(order.Field(i).Tag.Get("json"), ",omitempty"))
	}
	if want := []string{"id", "merchant_reference", "platform", "status", "shipment_id", "created_at"}; !slices.Equal(members, want) {
		t.Errorf("the test's order has members %v, want the spec's %v", members, want)
	}
	shipment := "shp \"<&>\u2028"
	for _, linked := range []bool{false, true} {
		o := loadingOrder{id: []byte("ord \"quoted\" <&> \u2028 é"), reference: []byte("\\ref\t"), platform: 4, status: 1, shipmentID: shipment,
			createdAt: instantOf(time.Date(2026, 3, 29, 1, 30, 0, 500, time.UTC))}
		want := orderJSON{ID: string(o.id), MerchantReference: string(o.reference), Platform: "tiktok_shop", Status: "partially_fulfilled", CreatedAt: "2026-03-29T01:30:00.0000005Z"}
		if linked {
			want.ShipmentID = &shipment
		}
		b, _ := marshalJSON(want)
		if got := o.appendResource(nil, o.status, linked); string(got) != string(b) {
			t.Errorf("appendResource = %s\nencoding/json writes %s", got, b)
		}
	}
}

func FuzzOrderQuery(f *testing.F) {
	for _, s := range []string{"", "limit=5", "limit=0", "limit=101&status=x", "status=fulfilled&created_from=2026-01-01T00:00:00Z&created_to=2026-12-01T00:00:00%2B01:00",
		"cursor=abc&limit=100", "limit=1&limit=1", "=", "&&&", "%zz=1", "a=%", "created_from=2026-01-02T00:00:00Z&created_to=2026-01-01T00:00:00Z", "limit=%2B5"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := parseOrderQuery(raw)
		if err != nil {
			if e := asAPIError(err); e == nil || (e.code != codeUnknownParameter && e.code != codeInvalidParameter) || e.param == nil {
				t.Fatalf("parseOrderQuery(%q) = %+v, want a 422 naming its parameter", raw, err)
			}
			return
		}
		if q.limit < 1 || q.limit > maxPageSize || q.filter.equal[0] < anyValue || int(q.filter.equal[0]) >= len(orderStatuses) || q.filter.from.after(q.filter.to) {
			t.Fatalf("parseOrderQuery(%q) accepted %+v", raw, q)
		}
	})
}

func BenchmarkGetOrder(b *testing.B) {
	benchServe(b, benchEnv(b, 0).h, newRequest("GET", "/v1/orders/ord_sbx_0001", "sk_test_sandbox_all"), 200)
}

// BenchmarkListOrders: pages of 100 with 1,000 and 1,000,000 seeded orders. The cost of a
// page must not grow with the number of orders.
func BenchmarkListOrders(b *testing.B) {
	for _, n := range []int{1000, 1000000} {
		e := benchEnv(b, n)
		ix := &e.sb.tenants.byID[seedTenant].current().orders
		oldest := ix.createdAt(ix.count() - 1)
		middle := ix.count() / 2
		every := everyOrder()
		deep := e.srv.cursors.sign(ix.tag, every.tag(), cursorPosition{ix.createdAt(middle), string(ix.idOf(middle))})
		cases := []struct{ name, query string }{
			{"no_filter", "limit=100"},
			{"status", "limit=100&status=fulfilled"},
			{"narrow_range_newest", "limit=100&created_from=2026-10-31T11:00:00Z&created_to=2026-10-31T23:00:00Z"},
			{"narrow_range_oldest", "limit=100&created_from=" + formatTimestamp(oldest) + "&created_to=" + formatTimestamp(oldest.Add(12*time.Hour))},
			{"deep_cursor", "limit=100&cursor=" + deep},
		}
		for _, c := range cases {
			b.Run(fmt.Sprintf("orders=%d/%s", n, c.name), func(b *testing.B) {
				benchServe(b, e.h, newRequest("GET", "/v1/orders?"+c.query, "sk_test_sandbox_all"), 200)
			})
		}
	}
}

// timedOrders is a sandbox whose acct_sandbox/test holds n orders like the seeded ones,
// of which, when moving, every tenth changes status once (at an instant spread evenly over
// the hour after its creation) and every hundredth is imported up to an hour late, loaded
// from a dataset as a user's would be. It returns the instant half-way through their
// creation.
func timedOrders(b *testing.B, n int, moving bool) (*env, time.Time) {
	every := 0
	if moving {
		every = 10
	}
	return ordersOf(b, n, every, func(k int) string { return orderStatuses[k%len(orderStatuses)] })
}

// ordersOf is a dataset of n orders, order k's status, and the status its change goes to,
// status(k) and status(k+1). With changeEvery 10, every tenth changes within the hour after
// its creation and one in a hundred is imported up to an hour late; with changeEvery 1,
// every order changes a month after the newest is created, which it returns instead of
// the instant half-way through.
func ordersOf(b *testing.B, n, changeEvery int, status func(k int) string) (*env, time.Time) {
	moving := changeEvery > 0
	var ds bytes.Buffer
	ds.WriteString(`{"accounts":[{"id":"acct_sandbox","environments":["test"]}],` +
		`"keys":[{"key":"sk_test_sandbox_all","account":"acct_sandbox","environment":"test","scopes":["orders:read"]}],"orders":[`)
	newest := time.Date(2026, 10, 31, 23, 0, 0, 0, time.UTC)
	var mid time.Time
	for j := range n {
		k := n - 1 - j
		created := newest.Add(-time.Duration(j-j/4) * 7 * time.Minute)
		if j == n/2 {
			mid = created
		}
		if j > 0 {
			ds.WriteByte(',')
		}
		fmt.Fprintf(&ds, `{"id":"ord_seed_%07d","account":"acct_sandbox","environment":"test","merchant_reference":"SEED-%07d","platform":%q,"status":%q,"created_at":%q`,
			k, k, platforms[k%len(platforms)], status(k), formatTimestamp(created))
		switch {
		case changeEvery == 1:
			fmt.Fprintf(&ds, `,"changes":[{"status":%q,"at":%q}]`, status(k+1), formatTimestamp(newest.Add(30*24*time.Hour)))
		case moving && j%changeEvery == 0 && status(k+1) != status(k):
			fmt.Fprintf(&ds, `,"changes":[{"status":%q,"at":%q}]`, status(k+1), formatTimestamp(created.Add(time.Duration(j*37%3600+1)*time.Second)))
		}
		if changeEvery == 10 && j%100 == 1 {
			fmt.Fprintf(&ds, `,"imported_at":%q`, formatTimestamp(created.Add(time.Duration(j*53%3600)*time.Second)))
		}
		ds.WriteByte('}')
	}
	ds.WriteString("]}")
	sb, err := loadBytes("moving", ds.Bytes(), 0, testNow, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	s, err := newServer(sb, serverOptions{access: newLogBuffer(io.Discard, time.Hour), journal: defaultJournal})
	if err != nil {
		b.Fatal(err)
	}
	if changeEvery == 1 {
		return &env{h: s.handler(), srv: s, sb: sb}, newest
	}
	return &env{h: s.handler(), srv: s, sb: sb}, mid
}

// BenchmarkListOrdersWithTimelines: pages of 1,000,000 orders of which 10% change status
// once and 1% are imported late, the clock half-way through, against the same pages of the
// same orders without timelines: each should cost at most twice as much.
func BenchmarkListOrdersWithTimelines(b *testing.B) {
	for _, moving := range []bool{false, true} {
		e, mid := timedOrders(b, 1000000, moving)
		e.sb.tenants.byID[seedTenant].clock.freeze(mid)
		for _, query := range []string{"limit=100", "limit=100&status=unfulfilled", "limit=100&status=partially_fulfilled", "limit=100&status=fulfilled", "limit=100&status=cancelled"} {
			name := strings.TrimPrefix(strings.TrimPrefix(query, "limit=100"), "&status=")
			if name == "" {
				name = "no_filter"
			}
			b.Run(fmt.Sprintf("timelines=%v/%s", moving, name), func(b *testing.B) {
				benchServe(b, e.h, newRequest("GET", "/v1/orders?"+query, "sk_test_sandbox_all"), 200)
			})
		}
	}
}

// BenchmarkOrderStore: what 1,000,000 orders cost to build and hold: the heap they keep
// per order, and the time to seed and store them.
func BenchmarkOrderStore(b *testing.B) {
	const n = 1000000
	var before uint64
	var kept *sandbox
	for b.Loop() {
		kept = nil
		before = heapAfterGC()
		sb, err := loadBytes("bench", defaultDataset, n, testNow, slog.New(slog.DiscardHandler))
		if err != nil {
			b.Fatal(err)
		}
		kept = sb
	}
	b.ReportMetric(float64(heapAfterGC()-before)/n, "heap-bytes/order")
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/1M-orders")
	runtime.KeepAlive(kept)
}

// ===== cursor.go: Cursors =====

// cursor.go: what a cursor binds, and that nothing else passes.

func TestCursorBinding(t *testing.T) {
	t.Parallel()
	const key = "sk_test_sandbox_all"
	e := newEnv(t, envOptions{seed: 40, secret: "secret-one"})
	first := decodePage(t, e.get(t, "/v1/orders?limit=5&status=fulfilled&created_to=2026-11-01T00:00:00Z", key))
	cursor := *first.Pagination.NextCursor
	next := "/v1/orders?status=fulfilled&created_to=2026-11-01T00:00:00Z&cursor="
	if rep := e.get(t, next+cursor, key); rep.status != 200 {
		t.Fatalf("the cursor with its own filters = %s, want 200", rep)
	}
	// The same instant written with another offset is the same filter.
	if rep := e.get(t, "/v1/orders?status=fulfilled&created_to=2026-11-01T01:00:00%2B01:00&cursor="+cursor, key); rep.status != 200 {
		t.Errorf("same filters, other spelling of the instant = %s, want 200", rep)
	}
	raw, err := base64.RawURLEncoding.DecodeString(cursor)
	if err != nil {
		t.Fatal(err)
	}
	tamper := func(i int) string {
		b := slices.Clone(raw)
		b[i] ^= 0x01
		return base64.RawURLEncoding.EncodeToString(b)
	}
	tests := []struct {
		name, query, key string
	}{
		{"other status", "status=cancelled&created_to=2026-11-01T00:00:00Z&cursor=" + cursor, key},
		{"no status", "created_to=2026-11-01T00:00:00Z&cursor=" + cursor, key},
		{"other created_to", "status=fulfilled&created_to=2026-11-01T00:00:01Z&cursor=" + cursor, key},
		{"created_from added", "status=fulfilled&created_from=2020-01-01T00:00:00Z&created_to=2026-11-01T00:00:00Z&cursor=" + cursor, key},
		{"no filters", "cursor=" + cursor, key},
		{"another account", "status=fulfilled&created_to=2026-11-01T00:00:00Z&cursor=" + cursor, "sk_test_other_all"},
		{"padded", "status=fulfilled&created_to=2026-11-01T00:00:00Z&cursor=" + cursor + "%3D%3D", key},
		{"truncated by one", "status=fulfilled&created_to=2026-11-01T00:00:00Z&cursor=" + cursor[:len(cursor)-1], key},
		{"truncated by half", "status=fulfilled&created_to=2026-11-01T00:00:00Z&cursor=" + cursor[:len(cursor)/2], key},
		{"standard base64 alphabet", "status=fulfilled&created_to=2026-11-01T00:00:00Z&cursor=" + url.QueryEscape(base64.StdEncoding.EncodeToString(raw)), key},
		{"not base64", "status=fulfilled&created_to=2026-11-01T00:00:00Z&cursor=%21%21%21", key},
		{"carriage return inserted", "status=fulfilled&created_to=2026-11-01T00:00:00Z&cursor=" + cursor[:10] + "%0D" + cursor[10:], key},
		{"line feed appended", "status=fulfilled&created_to=2026-11-01T00:00:00Z&cursor=" + cursor + "%0A", key},
		{"huge", "status=fulfilled&created_to=2026-11-01T00:00:00Z&cursor=" + strings.Repeat("A", 5000), key},
		{"a character appended", "status=fulfilled&created_to=2026-11-01T00:00:00Z&cursor=" + cursor + "A", key},
		{"percent signs", "status=fulfilled&created_to=2026-11-01T00:00:00Z&cursor=%25%25%25", key},
	}
	for i := range raw {
		tests = append(tests, struct{ name, query, key string }{"byte " + strconv.Itoa(i) + " flipped", "status=fulfilled&created_to=2026-11-01T00:00:00Z&cursor=" + tamper(i), key})
	}
	// The last character carries spare bits: any other letter there must not pass either.
	last := cursor[len(cursor)-1]
	for _, c := range "AQgw_-" {
		if byte(c) != last {
			tests = append(tests, struct{ name, query, key string }{"last character " + string(c), "status=fulfilled&created_to=2026-11-01T00:00:00Z&cursor=" + cursor[:len(cursor)-1] + string(c), key})
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantProblem(t, e.get(t, "/v1/orders?"+tt.query, tt.key), 400, "invalid_cursor", "cursor")
		})
	}
	// Another sandbox's cursor (another secret), and a restarted sandbox without one.
	other := newEnv(t, envOptions{seed: 40, secret: "secret-two"})
	wantProblem(t, other.get(t, next+cursor, key), 400, "invalid_cursor", "cursor")
	random := newEnv(t, envOptions{seed: 40})
	wantProblem(t, random.get(t, next+cursor, key), 400, "invalid_cursor", "cursor")
	// The same secret (-cursor-secret) keeps cursors valid across a restart.
	same := newEnv(t, envOptions{seed: 40, secret: "secret-one"})
	if rep := same.get(t, next+cursor, key); rep.status != 200 {
		t.Errorf("a restart with the same -cursor-secret = %s, want 200", rep)
	}
}

// sign is the cursor for the page that ends at pos, as a string (the server appends
// cursors straight into its pages).
func (c *cursorSigner) sign(tenant, filters tag, pos cursorPosition) string {
	return string(c.appendSigned(nil, tenant, filters, pos.createdAt, []byte(pos.id)))
}

// TestCursorBindsEnvironment: the environment is part of the tenant a cursor is bound to.
// (Live keys answer 503 before any parameter, so this is only reachable below the API.)
func TestCursorBindsEnvironment(t *testing.T) {
	t.Parallel()
	c := newCursorSigner([]byte("k"))
	pos := cursorPosition{createdAt: testNow, id: "ord_1"}
	every := everyOrder()
	filters := every.tag()
	s := c.sign(tagOf("tenant", "acct_sandbox", "test"), filters, pos)
	if _, _, err := c.verify(s, tagOf("tenant", "acct_sandbox", "live")); err != errCursorTenant {
		t.Errorf("verify in the live environment = %v, want %v", err, errCursorTenant)
	}
	got, bound, err := c.verify(s, tagOf("tenant", "acct_sandbox", "test"))
	if err != nil || got != pos || bound != filters {
		t.Errorf("verify = %v, %v, %v; want %v and its filters", got, bound, err, pos)
	}
}

func FuzzCursorVerify(f *testing.F) {
	c := newCursorSigner([]byte("fuzz"))
	fulfilled := everyOrder()
	fulfilled.equal[0] = 2
	tenant, filters := tagOf("tenant", "acct_sandbox", "test"), fulfilled.tag()
	for _, pos := range []cursorPosition{{testNow, "ord_sbx_0001"}, {time.Date(1, 1, 1, 0, 0, 0, 1, time.UTC), "x"}, {testNow.Add(time.Nanosecond), strings.Repeat("o", 300)}} {
		f.Add(c.sign(tenant, filters, pos))
	}
	for _, s := range []string{"", "AA", "not-a-cursor", "AcFqYOrmVhfAdy3-TVZlKt8AAAAAauZkLAAAAABvcmRf", strings.Repeat("A", 2000)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		pos, bound, err := c.verify(s, tenant)
		if err != nil {
			if e := asAPIError(err); e == nil || e.code != codeInvalidCursor || e.param == nil || *e.param != "cursor" {
				t.Fatalf("verify(%q) = %+v, want an invalid_cursor error", s, err)
			}
			return
		}
		// Only a cursor this signer issued verifies, and it has one spelling. The filters it
		// binds may be any (a cursor signed for other filters, or by an older build with this
		// key, verifies: whether they are the page's is the list's to judge).
		if again := c.sign(tenant, bound, pos); again != s {
			t.Fatalf("verify(%q) passed, but the cursor for its position is %q", s, again)
		}
	})
}

// ===== errors.go: Errors, simulated answers and the floor =====

// errors.go: codes, problems, JSON strings, timestamps.

// TestErrorCodes: the document names every code the server answers with, and no other
// (each code's status is checked where it is answered, and against the document's own
// table in TestOpenAPIDocumentForClients).
func TestErrorCodes(t *testing.T) {
	t.Parallel()
	want := slices.Sorted(maps.Keys(codeStatus))
	var documented []code
	for _, c := range asSlice(asMap(asMap(asMap(asMap(theOpenAPI(t).root["components"])["schemas"])["Problem"])["properties"])["code"].(map[string]any)["enum"]) {
		documented = append(documented, code(c.(string)))
	}
	if got := slices.Sorted(slices.Values(documented)); !slices.Equal(got, want) {
		t.Errorf("the document's codes %v, want the server's %v", got, want)
	}
}

// TestProblemBodyIsWhatEncodingJSONWrites: the hand-appended error body is the problem
// type as encoding/json writes it, with and without a param.
func TestProblemBodyIsWhatEncodingJSONWrites(t *testing.T) {
	t.Parallel()
	for _, e := range []*apiError{errTrackingNotFound, errCursorForged, paramError(codeUnknownParameter, "\xff <&> \"x\"", "odd \u2028 detail"), paramError(codeUnknownParameter, "", "")} {
		status := e.status()
		want, err := marshalJSON(problem{"about:blank", rfc9110Titles[status], status, e.detail, e.code, e.param, "req_x"})
		if err != nil {
			t.Fatal(err)
		}
		if got := appendProblem(nil, e, "req_x"); string(got) != string(want) {
			t.Errorf("appendProblem(%v) = %s\nencoding/json writes %s", e, got, want)
		}
	}
}

func TestAppendJSONStringMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "plain", "quote\" back\\slash", "ctl \x00\x01\x1f\x7f\n\r\t", "html <&>", "\u2028\u2029", "bad \xff\xfe utf8 \xe2\x82", "é ü 日本 🚚", "\uFFFD literal"} {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		enc.Encode(s)
		want := strings.TrimSuffix(buf.String(), "\n")
		if got := string(appendJSONString(nil, s)); got != want {
			t.Errorf("appendJSONString(%q) = %s, want %s", s, got, want)
		}
	}
}

func TestParseTimestamp(t *testing.T) {
	t.Parallel()
	valid := map[string]string{
		"2026-11-20T11:00:00+00:00":           "2026-11-20T11:00:00Z",
		"2026-11-20T11:00:00Z":                "2026-11-20T11:00:00Z",
		"2026-11-20t11:00:00z":                "2026-11-20T11:00:00Z",
		"2026-03-29T02:30:00+01:00":           "2026-03-29T01:30:00Z",
		"2026-10-25T01:30:00+01:00":           "2026-10-25T00:30:00Z",
		"2026-10-25T01:30:00+00:00":           "2026-10-25T01:30:00Z",
		"2026-11-20T23:30:00-05:00":           "2026-11-21T04:30:00Z",
		"2026-11-20T11:00:00.5Z":              "2026-11-20T11:00:00.5Z",
		"2026-11-20T11:00:00.120000Z":         "2026-11-20T11:00:00.12Z",
		"2026-11-20T11:00:00.000Z":            "2026-11-20T11:00:00Z",
		"2026-11-20T11:00:00.123456789Z":      "2026-11-20T11:00:00.123456789Z",
		"2026-11-20T11:00:00.1234567891234Z":  "2026-11-20T11:00:00.123456789Z",
		"2028-02-29T00:00:00Z":                "2028-02-29T00:00:00Z",
		"2026-11-20T11:00:00+23:59":           "2026-11-19T11:01:00Z",
		"2026-11-20T11:00:00-00:00":           "2026-11-20T11:00:00Z",
		"0000-01-01T00:00:00Z":                "0000-01-01T00:00:00Z",
		"9999-12-31T23:59:59.999999999+00:00": "9999-12-31T23:59:59.999999999Z",
	}
	for in, want := range valid {
		got, err := parseTimestamp(in)
		if err != nil || formatTimestamp(got) != want {
			t.Errorf("parseTimestamp(%q) = %s, %v; want %s", in, formatTimestamp(got), err, want)
		}
	}
	for _, in := range []string{
		"", "2026-11-20T09:00:00", "2026-11-20 10:00:00", "2026-11-20 10:00:00Z", "2026-11-20T1:30:00Z",
		"2026-11-20T24:00:00Z", "2026-11-20T23:60:00Z", "2026-12-31T23:59:60Z", "2026-11-20T11:00:00+24:00",
		"2026-11-20T11:00:00+01:60", "2026-11-20T11:00:00+0100", "2026-11-20T11:00:00+01", "2026-11-20T11:00:00 +01:00",
		"2026-02-29T00:00:00Z", "2026-13-01T00:00:00Z", "2026-00-01T00:00:00Z", "2026-11-00T00:00:00Z", "2026-11-31T00:00:00Z",
		"2026-11-20T11:00:00.Z", "2026-11-20T11:00:00,5Z", "26-11-20T11:00:00Z", "+2026-11-20T11:00:00Z", "2026-11-20T11:00:00ZZ",
		"2026-11-20T11:00:00Z ", " 2026-11-20T11:00:00Z", "2026/11/20T11:00:00Z", "garbage", "2026-11-20T11:00:00UTC",
		"２０２６-11-20T11:00:00Z", "2026-11-20T11:00:00-0a:00", "10000-01-01T00:00:00Z",
	} {
		if got, err := parseTimestamp(in); err != errNotRFC3339 {
			t.Errorf("parseTimestamp(%q) = %s, %v; want %v", in, formatTimestamp(got), err, errNotRFC3339)
		}
	}
	// RFC 3339, but an instant it cannot write in UTC: refused for that reason.
	for _, in := range []string{"0000-01-01T00:00:00+01:00", "9999-12-31T23:00:00-01:00"} {
		if got, err := parseTimestamp(in); err != errOutOfRFC3339 {
			t.Errorf("parseTimestamp(%q) = %s, %v; want %v", in, formatTimestamp(got), err, errOutOfRFC3339)
		}
	}
}

var timestampPattern = regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]*[1-9])?Z$`)

func FuzzParseTimestamp(f *testing.F) {
	for _, s := range []string{"2026-03-29T02:30:00+01:00", "2026-10-25T01:30:00Z", "2026-11-20T09:00:00", "2026-11-20 10:00:00",
		"2026-11-20T1:30:00Z", "2026-11-20T24:00:00Z", "2026-12-31T23:59:60Z", "2026-11-20T11:00:00+24:00", "2026-11-20t11:00:00.123z",
		"0000-01-01T00:00:00Z", "9999-12-31T23:59:59.9999999999-23:59", "2028-02-29T00:00:00Z", "2026-02-29T00:00:00Z", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := parseTimestamp(s)
		if err != nil {
			return
		}
		out := formatTimestamp(got)
		if !timestampPattern.MatchString(out) {
			t.Fatalf("parseTimestamp(%q) writes back as %q, not UTC RFC 3339", s, out)
		}
		if back, err := parseTimestamp(out); err != nil || !back.Equal(got) {
			t.Fatalf("%q -> %q does not read back as the same instant", s, out)
		}
		if goT, err := time.Parse(time.RFC3339Nano, strings.ToUpper(s)); err == nil && !goT.Equal(got) {
			t.Fatalf("parseTimestamp(%q) = %s, time.Parse reads %s", s, out, goT.UTC().Format(time.RFC3339Nano))
		}
	})
}

// FuzzParseInstant: an instant of a dataset's schedule is RFC 3339 or relative to the
// start; what is read writes back as a timestamp that reads as the same instant.
// relativeGrammar is the contract's grammar of an instant relative to the start instant, as
// a regular expression: what relativeParts reads by hand.
var relativeGrammar = regexp.MustCompile(`^start(?:[+-](?:[0-9]+(?:\.[0-9]+)?(?:ns|us|µs|μs|ms|s|m|h))+)?$`)

func FuzzParseInstant(f *testing.F) {
	for _, s := range []string{"start", "start+90s", "start-10m", "start+1h30m", "start+0s", "start+0", "start + 1s", "START", "start+1.5h", "start+-1s",
		"start+1µs", "start+9999999999h", "2026-11-01T09:30:00Z", "startx", "", "start+1.s", "start+.5s", "start+1ms2m", "start+1mss", "start+1μs", "start-", "start+1h-1m", "start1s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if _, _, ok := relativeParts(s); ok != relativeGrammar.MatchString(s) {
			t.Fatalf("relativeParts(%q) reads it as relative: %v; the grammar: %v", s, ok, !ok)
		}
		got, err := parseInstant(s, testNow)
		if err != nil {
			return
		}
		if back, err := parseTimestamp(formatTimestamp(got)); err != nil || !back.Equal(got) {
			t.Fatalf("parseInstant(%q) = %s, which does not read back", s, formatTimestamp(got))
		}
		if rel, ok := strings.CutPrefix(s, "start"); ok {
			d, err := time.Duration(0), error(nil)
			if rel != "" {
				d, err = time.ParseDuration(rel)
			}
			if err != nil || !testNow.Add(d).Equal(got) || strings.ContainsAny(rel, " \t") {
				t.Fatalf("parseInstant(%q) = %s; want the start plus %q", s, formatTimestamp(got), rel)
			}
		}
	})
}

// ===== main.go, landing: the reference, for people and for agents =====

// referenceLinks are the targets of a page's links (href and src), in order.
func referenceLinks(page string) []string {
	var out []string
	for _, m := range regexp.MustCompile(`(?:href|src)="([^"]*)"`).FindAllStringSubmatch(page, -1) {
		out = append(out, html.UnescapeString(m[1]))
	}
	return out
}

// TestReference: GET /reference is one page, whole without a script: a section for every
// operation of the document, every schema, every shared answer, every error code of the
// table, every finding, every conformance rule and every exam, each at its anchor; every link
// within the page names an id of it, every other link a route that answers 200 at the
// origin the request named; nothing is loaded from elsewhere; at most 512 KiB; keyless,
// never journaled; HEAD as GET, other methods 405.
func TestReference(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	rep := e.get(t, "/reference", "")
	page := string(rep.body)
	if rep.status != 200 || rep.header.Get("Content-Type") != "text/html; charset=utf-8" || len(rep.body) > 512<<10 ||
		rep.header.Get("Content-Security-Policy") != "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:; form-action 'none'; base-uri 'none'; frame-ancestors 'self'" {
		t.Fatalf("%d %v, %d bytes: the page reaches this sandbox only, and nothing else", rep.status, rep.header, len(rep.body))
	}
	// The Markdown: every link to an anchor names a heading of it, and every table row has
	// its header's cells (a | in a cell escaped).
	md := string(e.get(t, "/reference.md", "").body)
	headings := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#+ (\S+)$`).FindAllStringSubmatch(md, -1) {
		headings[m[1]] = true
	}
	for _, m := range regexp.MustCompile(`\]\(#([^)]+)\)`).FindAllStringSubmatch(md, -1) {
		if !headings[m[1]] {
			t.Errorf("/reference.md links #%s, which no heading is", m[1])
		}
	}
	if got := mdCell("code=429|500\nnext"); got != `code=429\|500 next` { // a cell's own | escaped, so that no row splits
		t.Errorf("mdCell = %q", got)
	}
	cells := func(row string) int { return len(regexp.MustCompile(`[^\\]\|`).FindAllString(row, -1)) }
	header := 0
	for _, line := range strings.Split(md, "\n") {
		switch {
		case !strings.HasPrefix(line, "|"):
			header = 0
		case header == 0:
			header = cells(line)
		case cells(line) != header:
			t.Errorf("/reference.md's row has %d cells, its header %d: %s", cells(line), header, cutField(line, 200))
		}
	}
	ids := map[string]bool{}
	for _, m := range regexp.MustCompile(` id="([^"]+)"`).FindAllStringSubmatch(page, -1) {
		if ids[m[1]] {
			t.Errorf("the id %s is given twice", m[1])
		}
		ids[m[1]] = true
	}
	want := []string{"op-getOrder", "schema-TrackingView", "error-invalid_cursor", "finding-missed_import", "rule-tracking.dedup", "exam-order-sync"}
	doc := theOpenAPI(t)
	for _, p := range doc.paths {
		for _, op := range p.item {
			want = append(want, "op-"+fmt.Sprint(asMap(op)["operationId"]))
		}
	}
	for name := range asMap(asMap(doc.root["components"])["schemas"]) {
		want = append(want, "schema-"+name)
	}
	for name := range asMap(asMap(doc.root["components"])["responses"]) {
		want = append(want, "response-"+name)
	}
	for c := range codeStatus {
		want = append(want, "error-"+string(c))
	}
	for _, k := range findingKinds {
		want = append(want, "finding-"+k.code)
	}
	for _, r := range kitRules {
		want = append(want, "rule-"+r.id)
	}
	for _, x := range examCatalogue {
		want = append(want, "exam-"+x.name)
	}
	for _, id := range want {
		if !ids[id] {
			t.Errorf("no #%s", id)
		}
	}
	if len(want) < 150 {
		t.Errorf("only %d anchors checked", len(want))
	}
	checked := 0
	for _, link := range referenceLinks(page) {
		switch {
		case strings.HasPrefix(link, "#"):
			if !ids[strings.TrimPrefix(link, "#")] {
				t.Errorf("the link %s names no id of the page", link)
			}
		case strings.HasPrefix(link, "http://127.0.0.1:8080/"):
			if r := e.get(t, strings.TrimPrefix(link, "http://127.0.0.1:8080"), ""); r.status != 200 {
				t.Errorf("the link %s answers %d", link, r.status)
			}
		case link == "data:,": // the page's icon: none
		default:
			t.Errorf("the link %s leaves the sandbox", link)
		}
		checked++
	}
	if checked < 300 || regexp.MustCompile(`(?i)<(script|link|img|iframe)[^>]+(src|href)="(https?:)?//`).MatchString(page) || strings.Contains(page, "@import") {
		t.Errorf("%d links checked; something is loaded from elsewhere", checked)
	}
	// Whole without a script: the script only unhides the search box and the try-it forms.
	noScript := regexp.MustCompile(`(?s)<script>.*</script>`).ReplaceAllString(page, "")
	for _, s := range []string{`<section id="op-getOrder"`, "curl -s", "req, err := http.NewRequest", "await fetch(", "urllib.request.Request(", `"Authorization: Bearer $SANDBOX_KEY"`} {
		if !strings.Contains(noScript, html.EscapeString(s)) && !strings.Contains(noScript, s) {
			t.Errorf("the page without its script lacks %q", s)
		}
	}
	if strings.Count(page, `<form class="try"`) != countOps(doc) || strings.Count(page, "hidden>") < countOps(doc) {
		t.Errorf("%d try-it forms, want one hidden form an operation (%d)", strings.Count(page, `<form class="try"`), countOps(doc))
	}
	// The origin the request named, in every link and sample.
	long := newRequest(http.MethodGet, "/reference", "") // the longest origin a request may name: the page stays within its bound
	long.Host = strings.Repeat(strings.Repeat("a", 63)+".", 3) + strings.Repeat("b", 61) + ":65535"
	if rep := e.do(t, long); len(rep.body) > 512<<10 || !strings.Contains(string(rep.body), "http://"+long.Host+"/v1/orders/ord_sbx_0001") {
		t.Errorf("with a host of %d bytes the page is %d bytes", len(long.Host), len(rep.body))
	}
	named := newRequest(http.MethodGet, "/reference", "")
	named.Host = "localhost:9999"
	if other := e.do(t, named); !strings.Contains(string(other.body), "http://localhost:9999/v1/orders/ord_sbx_0001") || strings.Contains(string(other.body), originMark) {
		t.Error("the page does not name the origin of its request")
	}
	// Keyless and never journaled; HEAD as GET; other methods 405.
	if j := e.journalOf(t, "sk_test_sandbox_all", ""); len(j.Data) != 0 {
		t.Errorf("the reference's reads were journaled: %v", j.Data)
	}
	for _, path := range []string{"/reference", "/reference.md", "/llms.txt", "/README.md", "/docs/api.md"} {
		get, head := e.get(t, path, ""), e.do(t, newRequest(http.MethodHead, path, ""))
		if head.status != 200 || head.header.Get("Content-Length") != get.header.Get("Content-Length") || head.header.Get("Content-Type") != get.header.Get("Content-Type") {
			t.Errorf("HEAD %s: %d %v", path, head.status, head.header)
		}
		post := e.do(t, newRequest(http.MethodPost, path, "sk_test_sandbox_all"))
		wantProblem(t, post, 405, "method_not_allowed", "")
		if post.header.Get("Allow") != "GET, HEAD" {
			t.Errorf("POST %s: Allow %q", path, post.header.Get("Allow"))
		}
	}
}

// countOps counts the document's operations.
func countOps(doc *openAPI) int {
	n := 0
	for _, p := range doc.paths {
		n += len(p.item)
	}
	return n
}

// TestReferenceForAgents: /reference.md is the page in Markdown, every anchor a heading;
// /llms.txt says what the sandbox is, its base URL and three first calls, and every link of
// it answers 200; /README.md and /docs/{page}.md are the embedded pages, byte for byte, and
// no other name is served.
func TestReferenceForAgents(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	md := e.get(t, "/reference.md", "")
	headings := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#{2,4} (\S+)`).FindAllStringSubmatch(string(md.body), -1) {
		headings[m[1]] = true
	}
	page := string(e.get(t, "/reference", "").body)
	anchors := 0
	for _, m := range regexp.MustCompile(` id="((?:op|schema|response|error|finding|rule|exam)-[^"]+)"`).FindAllStringSubmatch(page, -1) {
		anchors++
		if !headings[m[1]] {
			t.Errorf("/reference.md has no heading %s", m[1])
		}
	}
	if md.status != 200 || md.header.Get("Content-Type") != "text/markdown; charset=utf-8" || anchors < 150 {
		t.Errorf("/reference.md: %d %q, %d anchors", md.status, md.header.Get("Content-Type"), anchors)
	}
	llms := e.get(t, "/llms.txt", "")
	text := string(llms.body)
	if llms.status != 200 || llms.header.Get("Content-Type") != "text/plain; charset=utf-8" || !strings.HasPrefix(text, "# Shipping API sandbox") ||
		!strings.Contains(text, "Base URL: http://127.0.0.1:8080/v1.") || strings.Count(text, "\n1. `curl")+strings.Count(text, "\n2. `curl")+strings.Count(text, "\n3. `curl") != 3 {
		t.Errorf("/llms.txt: %d\n%s", llms.status, text)
	}
	links := regexp.MustCompile(`\]\((http://127\.0\.0\.1:8080[^)]*)\)`).FindAllStringSubmatch(text, -1)
	pages, _ := filepath.Glob("docs/*.md")
	if len(links) != len(pages)+5 {
		t.Errorf("/llms.txt links %d pages, want the reference, the document, the page, the README, MCP and every docs page (%d)", len(links), len(pages)+5)
	}
	for _, l := range links {
		if r := e.get(t, strings.TrimPrefix(l[1], "http://127.0.0.1:8080"), ""); r.status != 200 {
			t.Errorf("/llms.txt's link %s answers %d", l[1], r.status)
		}
	}
	for _, name := range append([]string{"README.md"}, pages...) {
		want, _ := os.ReadFile(name)
		if got := e.get(t, "/"+name, ""); got.status != 200 || !bytes.Equal(got.body, want) || got.header.Get("Content-Type") != "text/markdown; charset=utf-8" {
			t.Errorf("/%s: %d, %d bytes, want the file's %d", name, got.status, len(got.body), len(want))
		}
	}
	for _, path := range []string{"/docs/nope.md", "/docs/api", "/docs/", "/docs/..%2fmain.go", "/docs/%2e%2e/go.mod", "/main.go", "/reference.html", "/LLMS.txt"} {
		if r := e.get(t, path, ""); r.status != 404 {
			t.Errorf("%s: %d, want 404", path, r.status)
		}
	}
}

// TestReferenceSamples: each operation's samples name its method and its example request;
// the curl of every GET a dataset's key may make answers 200 as written, with SANDBOX_KEY set;
// and the Go samples compile, each the body of a function.
func TestReferenceSamples(t *testing.T) {
	t.Parallel()
	needTools(t, "bash", "curl", "go")
	e := newEnv(t, envOptions{rate: -1, quiet: true})
	ts := httptest.NewServer(e.h)
	defer ts.Close()
	ref, err := theReference()
	if err != nil {
		t.Fatal(err)
	}
	data := referenceData{}
	d := newRefDoc(openAPIDocument)
	groups, err := d.operations(&data)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module samples\n\ngo 1.22\n"), 0o644)
	ran := 0
	for _, g := range groups {
		for i, op := range g.Ops {
			if len(op.Samples) != 4 || !bytes.Contains(ref.html, []byte(`id="op-`+op.ID+`"`)) {
				t.Fatalf("%s: %d samples", op.ID, len(op.Samples))
			}
			program := filepath.Join(dir, fmt.Sprintf("%s%d", op.ID, i)) // each sample a whole program, as a reader saves it
			os.MkdirAll(program, 0o755)
			os.WriteFile(filepath.Join(program, "main.go"), []byte(strings.ReplaceAll(op.Samples[1].Code, originMark, ts.URL)), 0o644)
			curl := op.Samples[0].Code
			if op.Method != http.MethodGet || op.NeedsSandboxKey || strings.Contains(op.Path, "exams/{id}") {
				continue
			}
			sh := exec.Command("bash", "-c", strings.ReplaceAll(curl, originMark, ts.URL)+" -o /dev/null -w '%{http_code}'")
			sh.Env = append(os.Environ(), "SANDBOX_KEY=sk_test_sandbox_all")
			if out, err := sh.Output(); err != nil || string(out) != "200" {
				t.Errorf("%s's curl answers %s (%v):\n%s", op.ID, out, err, curl)
			}
			ran++
		}
	}
	if ran < 10 {
		t.Errorf("only %d curls run", ran)
	}
	vet := exec.Command("go", "vet", "./...")
	vet.Dir = dir
	vet.Env = append(os.Environ(), "GOFLAGS=", "GOTOOLCHAIN=local")
	if out, err := vet.CombinedOutput(); err != nil {
		t.Errorf("the Go samples are not whole programs that compile: %v\n%s", err, out)
	}
	var getOrder string
	for _, g := range groups {
		for i, op := range g.Ops {
			if op.ID == "getOrder" {
				getOrder = fmt.Sprintf("./%s%d", op.ID, i)
			}
		}
	}
	run := exec.Command("go", "run", getOrder) // one of them run as written: GET /v1/orders/{id}
	run.Dir = dir
	run.Env = append(os.Environ(), "GOFLAGS=", "GOTOOLCHAIN=local", "SANDBOX_KEY=sk_test_sandbox_all")
	if out, err := run.CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "200 OK {\"id\":\"ord_sbx_0001\"") {
		t.Errorf("a Go sample run: %v\n%s", err, out)
	}
}

// atoiOr is s as a number, 0 when it is none.
func atoiOr(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// chromiumsOwn are the hosts of the services Chromium calls by itself (its updates, its
// account and autofill services), whatever page it opens.
var chromiumsOwn = map[string]bool{"clients2.google.com": true, "update.googleapis.com": true, "accounts.google.com": true, "content-autofill.googleapis.com": true,
	"optimizationguide-pa.googleapis.com": true, "redirector.gvt1.com": true, "safebrowsingohttpgateway.googleapis.com": true, "www.google.com": true}

// TestReferenceInABrowser: headless Chromium loads /reference through a proxy that records
// every request it makes (loopback included), types a key into the page's try-it form of
// GET /v1/orders and sends it: the form shows the 200 with its headers and its journal entry,
// and no request went anywhere but the sandbox. CI installs Chromium; elsewhere the test
// skips without it.
func TestReferenceInABrowser(t *testing.T) {
	t.Parallel()
	browser := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			browser = p
			break
		}
	}
	if browser == "" {
		needTools(t, "chromium")
	}
	e := newEnv(t, envOptions{wall: true, quiet: true})
	mux := http.NewServeMux()
	mux.Handle("/", e.h)
	// The harness: the page in a frame of the same origin, its try-it form of GET /v1/orders
	// filled and sent as a reader would, the answer copied out once it shows its journal entry.
	mux.HandleFunc("GET /harness", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `<!doctype html><iframe id="w1280" src="/reference" width="1280" height="800"></iframe><iframe id="w390" src="/reference" width="390" height="844"></iframe>
<iframe id="f" src="/reference" width="800" height="600"></iframe><pre id="widths">waiting</pre><pre id="out">waiting</pre><script>
var f = document.getElementById("f"), out = document.getElementById("out"), widths = document.getElementById("widths");
var measured = [];
["w1280", "w390"].forEach(function (id) {
  var frame = document.getElementById(id);
  frame.onload = function () {
    var root = frame.contentDocument.documentElement;
    measured.push("WIDTH " + id + " scroll " + root.scrollWidth + " client " + root.clientWidth);
    widths.textContent = measured.join("\n");
  };
});
f.onload = function () {
  var d = f.contentDocument, form = d.querySelector("#op-listOrders form.try");
  if (!form || form.hidden) { out.textContent = "no visible try-it form"; return; }
  d.getElementById("key").value = "sk_test_sandbox_all";
  form.querySelector("input[name=limit]").value = "1";
  form.querySelector("button").click();
  var tries = 0, poll = setInterval(function () {
    var pre = form.querySelector(".answer");
    if (pre.textContent.indexOf("journal entry") >= 0 || ++tries > 100) { clearInterval(poll); out.textContent = "ANSWER\n" + pre.textContent; }
  }, 50);
};
</script>`)
	})
	ts := httptest.NewServer(mux)
	defer ts.Close()
	var mu sync.Mutex
	var hosts []string
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hosts = append(hosts, r.Method+" "+r.Host)
		mu.Unlock()
		if r.Method == http.MethodConnect || "http://"+r.Host != ts.URL {
			http.Error(w, "not the sandbox", http.StatusForbidden)
			return
		}
		out := r.Clone(r.Context())
		out.RequestURI = ""
		res, err := http.DefaultTransport.RoundTrip(out)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer res.Body.Close()
		maps.Copy(w.Header(), res.Header)
		w.WriteHeader(res.StatusCode)
		io.Copy(w, res.Body)
	}))
	defer proxy.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--disable-default-apps", "--disable-extensions", "--disable-features=AutofillServerCommunication,OptimizationHints,MediaRouter",
		"--user-data-dir="+t.TempDir(),
		"--proxy-server="+proxy.URL, "--proxy-bypass-list=<-loopback>", "--virtual-time-budget=20000", "--dump-dom", ts.URL+"/harness")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", browser, err, out)
	}
	answer := html.UnescapeString(string(out))
	measures := regexp.MustCompile(`WIDTH (\w+) scroll (\d+) client (\d+)`).FindAllStringSubmatch(answer, -1)
	for _, m := range measures {
		if scroll, _ := strconv.Atoi(m[2]); scroll > atoiOr(m[3]) {
			t.Errorf("at %s the page scrolls sideways: %s px wide in %s px", strings.TrimPrefix(m[1], "w"), m[2], m[3])
		}
	}
	if n := len(measures); n != 2 {
		t.Errorf("the page measured at %d widths, want 1280 and 390:\n%s", n, answer)
	}
	if !strings.Contains(answer, "ANSWER\nHTTP 200") || !strings.Contains(answer, `"route":"/v1/orders","target":"/v1/orders?limit=1"`) || !strings.Contains(answer, "request-id: req_") {
		t.Errorf("the try-it form of GET /v1/orders:\n%s", answer)
	}
	mu.Lock()
	defer mu.Unlock()
	sandbox := 0
	for _, h := range hosts {
		method, host, _ := strings.Cut(h, " ")
		host, _, _ = strings.Cut(host, ":")
		switch {
		case method == http.MethodGet && "http://"+strings.TrimPrefix(h, "GET ") == ts.URL:
			sandbox++
		case chromiumsOwn[host]: // the browser's own services, which no page asks for
		default:
			t.Errorf("a request left the sandbox: %s (all: %v)", h, hosts)
		}
	}
	if sandbox < 4 {
		t.Errorf("the proxy saw %v: the browser did not go through it", hosts)
	}
}

// BenchmarkReference: GET /reference through the handler chain: the contract's bound is 20 ms.
func BenchmarkReference(b *testing.B) {
	e := newEnv(b, envOptions{quiet: true})
	b.ReportAllocs()
	for b.Loop() {
		rec := httptest.NewRecorder()
		e.h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://127.0.0.1:8080/reference", nil))
		if rec.Code != 200 {
			b.Fatal(rec.Code)
		}
	}
}

// ===== main.go, mcp: the MCP door =====

// main.go's MCP door: both transports and every revision driven with raw JSON-RPC, each
// tool's success and error result, each refusal, the journal and the findings of tool
// calls, the schemas held to the test file's validator, the resources, the stdio bridge in a
// real process, and what a tool call costs.

// mcpRequest is a POST /mcp of body as a client on this machine sends it, with the default
// dataset's key of both scopes; header pairs set fields ("" deletes one).
func mcpRequest(body string, headerPairs ...string) *http.Request {
	r := newBodyRequest(http.MethodPost, "/mcp", "sk_test_sandbox_all", body, "Content-Type", "application/json")
	r.RemoteAddr = "127.0.0.1:40000"
	for i := 0; i+1 < len(headerPairs); i += 2 {
		if headerPairs[i] == "Host" {
			r.Host = headerPairs[i+1]
		} else if headerPairs[i+1] == "" {
			r.Header.Del(headerPairs[i])
		} else {
			r.Header.Set(headerPairs[i], headerPairs[i+1])
		}
	}
	return r
}

// statelessRequest is a request of the stateless revision: the body with its _meta, and the
// headers that repeat it (name: the tool's or the resource's, "" for none).
func statelessRequest(id int, method, name, params string) (string, []string) {
	meta := `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}`
	if params == "" {
		params = "{" + meta + "}"
	} else {
		params = "{" + meta + "," + strings.TrimPrefix(params, "{")
	}
	headers := []string{"MCP-Protocol-Version", "2026-07-28", "Mcp-Method", method}
	if name != "" {
		headers = append(headers, "Mcp-Name", name)
	}
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":%q,"params":%s}`, id, method, params), headers
}

// rpcAnswer is a JSON-RPC answer, its numbers kept as written.
type rpcAnswer struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  map[string]any  `json:"result"`
	Error   *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
		Data    any    `json:"data"`
	} `json:"error"`
}

// mcp sends r to the door and checks what holds for each of its answers: the common headers
// and an exact length, no session, and a body that is one JSON-RPC answer (application/json)
// or the API's problem (401, 405, 413, 503), or nothing (202).
func (e *env) mcp(t testing.TB, r *http.Request) (reply, rpcAnswer) {
	t.Helper()
	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, r)
	res := rec.Result()
	rep := reply{status: res.StatusCode, header: res.Header, body: rec.Body.Bytes()}
	if !requestIDPattern.MatchString(rep.header.Get("Request-Id")) || rep.header.Get("Cache-Control") != "no-store" || rep.header.Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("the door's answer lacks the common headers: %v", rep.header)
	}
	if rep.header.Get("Mcp-Session-Id") != "" {
		t.Errorf("the door sent Mcp-Session-Id %q: it keeps no sessions", rep.header.Get("Mcp-Session-Id"))
	}
	var a rpcAnswer
	switch ct := rep.header.Get("Content-Type"); {
	case rep.status == http.StatusAccepted || rep.status == http.StatusNoContent && r.Method == http.MethodOptions:
		if len(rep.body) != 0 {
			t.Errorf("a %d with a body: %s", rep.status, rep.body)
		}
	case rep.status == 401 || rep.status == 405 || rep.status == 413 || rep.status == 503:
		checkResponse(t, r, rep)
	case ct != "application/json" || rep.header.Get("Content-Length") != strconv.Itoa(len(rep.body)):
		t.Errorf("the door answered %d with Content-Type %q, Content-Length %q: %s", rep.status, ct, rep.header.Get("Content-Length"), rep.body)
	default:
		dec := json.NewDecoder(bytes.NewReader(rep.body))
		dec.UseNumber()
		dec.DisallowUnknownFields()
		if err := dec.Decode(&a); err != nil || a.JSONRPC != "2.0" || (a.Result == nil) == (a.Error == nil) || a.ID == nil {
			t.Fatalf("not one JSON-RPC answer (%v): %s", err, rep.body)
		}
	}
	return rep, a
}

// rpcFault checks that a answers with the JSON-RPC error code, under the HTTP status.
func rpcFault(t testing.TB, rep reply, a rpcAnswer, status, code int) {
	t.Helper()
	if rep.status != status || a.Error == nil || a.Error.Code != code || a.Error.Message == "" {
		t.Errorf("answered %d %s, want %d with JSON-RPC error %d", rep.status, rep.body, status, code)
	}
}

// TestMCPRevisions: each legacy revision's handshake is answered in that revision (any other
// in 2025-11-25), and what a later request of it is shown is what the revision has; the
// stateless revision's server/discover, its result members and caching hints; the methods a
// revision lacks; and no request is refused because no initialize came first.
func TestMCPRevisions(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1})
	initialize := func(v string) string {
		return `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"` + v + `","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	}
	for _, c := range []struct{ asked, answered string }{
		{"2024-11-05", "2024-11-05"}, {"2025-03-26", "2025-03-26"}, {"2025-06-18", "2025-06-18"}, {"2025-11-25", "2025-11-25"},
		{"2023-01-01", "2025-11-25"}, {"2026-07-28", "2025-11-25"}, // the stateless revision has no handshake
	} {
		t.Run(c.asked, func(t *testing.T) {
			t.Parallel()
			rep, a := e.mcp(t, mcpRequest(initialize(c.asked)))
			info := asMap(a.Result["serverInfo"])
			_, titled := info["title"]
			caps, _ := json.Marshal(a.Result["capabilities"])
			if rep.status != 200 || a.Result["protocolVersion"] != c.answered || string(caps) != `{"resources":{},"tools":{}}` ||
				info["name"] != "shipping-api-sandbox" || titled != (c.answered >= "2025-06-18") ||
				!strings.Contains(fmt.Sprint(a.Result["instructions"]), "http://127.0.0.1:8080/v1") || a.Result["resultType"] != nil {
				t.Fatalf("initialize %s: %s", c.asked, rep.body)
			}
			// Later requests name the revision in MCP-Protocol-Version: what it lacks is not sent.
			_, a = e.mcp(t, mcpRequest(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`, "MCP-Protocol-Version", c.answered))
			tool := asMap(asSlice(a.Result["tools"])[0])
			_, annotated := tool["annotations"]
			_, titled = tool["title"]
			_, typed := tool["outputSchema"]
			if annotated != (c.answered >= "2025-03-26") || titled != (c.answered >= "2025-06-18") || typed != titled || a.Result["ttlMs"] != nil {
				t.Errorf("tools/list in %s: annotations %v, title %v, outputSchema %v, ttlMs %v", c.answered, annotated, titled, typed, a.Result["ttlMs"])
			}
			_, a = e.mcp(t, mcpRequest(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"get_clock"}}`, "MCP-Protocol-Version", c.answered))
			if _, structured := a.Result["structuredContent"]; structured != (c.answered >= "2025-06-18") || a.Result["isError"] != false {
				t.Errorf("tools/call in %s: %v", c.answered, a.Result)
			}
			if rep, a := e.mcp(t, mcpRequest(`{"jsonrpc":"2.0","id":"p","method":"ping"}`, "MCP-Protocol-Version", c.answered)); rep.status != 200 || len(a.Result) != 0 || string(a.ID) != `"p"` {
				t.Errorf("ping: %s", rep.body)
			}
		})
	}
	t.Run("a legacy request without MCP-Protocol-Version is 2025-03-26's", func(t *testing.T) {
		t.Parallel()
		_, a := e.mcp(t, mcpRequest(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`))
		tool := asMap(asSlice(a.Result["tools"])[0])
		if _, annotated := tool["annotations"]; !annotated || tool["title"] != nil {
			t.Errorf("tools/list without a revision: %v", tool)
		}
	})
	t.Run("notifications and the legacy methods", func(t *testing.T) {
		t.Parallel()
		if rep, _ := e.mcp(t, mcpRequest(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)); rep.status != 202 {
			t.Errorf("notifications/initialized: %d", rep.status)
		}
		for _, method := range []string{"prompts/list", "logging/setLevel", "server/ping"} {
			rep, a := e.mcp(t, mcpRequest(`{"jsonrpc":"2.0","id":4,"method":"`+method+`"}`, "MCP-Protocol-Version", "2025-11-25"))
			rpcFault(t, rep, a, 200, -32601)
		}
	})
	t.Run("2026-07-28", func(t *testing.T) {
		t.Parallel()
		body, headers := statelessRequest(1, "server/discover", "", "")
		rep, a := e.mcp(t, mcpRequest(body, headers...))
		versions, _ := json.Marshal(a.Result["supportedVersions"])
		caps, _ := json.Marshal(a.Result["capabilities"])
		info := asMap(asMap(a.Result["_meta"])["io.modelcontextprotocol/serverInfo"])
		if rep.status != 200 || string(versions) != `["2026-07-28","2025-11-25","2025-06-18","2025-03-26","2024-11-05"]` || string(caps) != `{"resources":{},"tools":{}}` ||
			a.Result["resultType"] != "complete" || info["name"] != "shipping-api-sandbox" || info["title"] == nil ||
			fmt.Sprint(a.Result["ttlMs"]) != "3600000" || a.Result["cacheScope"] != "public" || !strings.Contains(fmt.Sprint(a.Result["instructions"]), "create_sandbox") {
			t.Fatalf("server/discover: %s", rep.body)
		}
		for _, c := range []struct {
			method, name, params string
			cached               bool
		}{
			{"tools/list", "", "", true},
			{"resources/list", "", "", true},
			{"resources/templates/list", "", "", true},
			{"resources/read", "sandbox:///README.md", `{"uri":"sandbox:///README.md"}`, true},
			{"tools/call", "get_clock", `{"name":"get_clock","arguments":{}}`, false},
		} {
			body, headers := statelessRequest(2, c.method, c.name, c.params)
			rep, a := e.mcp(t, mcpRequest(body, headers...))
			_, ttl := a.Result["ttlMs"]
			if rep.status != 200 || a.Result["resultType"] != "complete" || asMap(a.Result["_meta"])["io.modelcontextprotocol/serverInfo"] == nil ||
				ttl != c.cached || (a.Result["cacheScope"] == "public") != c.cached {
				t.Errorf("%s: %s", c.method, rep.body)
			}
			if c.method == "resources/templates/list" && len(asSlice(a.Result["resourceTemplates"])) != 0 {
				t.Errorf("resources/templates/list: %s", rep.body)
			}
		}
		for _, method := range []string{"initialize", "ping", "prompts/list", "logging/setLevel"} {
			body, headers := statelessRequest(3, method, "", "")
			rep, a := e.mcp(t, mcpRequest(body, headers...))
			rpcFault(t, rep, a, 404, -32601)
		}
	})
}

// TestMCPRefusals: who may knock (a key of this sandbox, of any scopes; a live key 503;
// -mcp-key for a loopback client without Authorization; a foreign Origin or, on loopback, a
// foreign Host 403), the envelope (one JSON-RPC message as application/json, within the body
// cap) and the stateless revision's headers and _meta.
func TestMCPRefusals(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1})
	list := `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`
	for _, c := range []struct {
		name    string
		r       *http.Request
		status  int
		code    string // the problem's, or
		rpcCode int    // the JSON-RPC error's
	}{
		{"no key", mcpRequest(list, "Authorization", ""), 401, "missing_api_key", 0},
		{"an unknown key", mcpRequest(list, "Authorization", "Bearer sk_test_nobody"), 401, "invalid_api_key", 0},
		{"a revoked key", mcpRequest(list, "Authorization", "Bearer sk_test_sandbox_revoked"), 401, "revoked_api_key", 0},
		{"an expired key", mcpRequest(list, "Authorization", "Bearer sk_test_sandbox_expired"), 401, "expired_api_key", 0},
		{"a live key", mcpRequest(list, "Authorization", "Bearer sk_live_sandbox_all"), 503, "live_not_released", 0},
		{"a key of no scopes knocks", mcpRequest(list, "Authorization", "Bearer sk_test_sandbox_none"), 200, "", 0},
		{"a foreign Origin", mcpRequest(list, "Origin", "https://evil.example"), 403, "", -32000},
		{"a file's Origin", mcpRequest(list, "Origin", "null"), 403, "", -32000},
		{"a loopback Origin", mcpRequest(list, "Origin", "http://localhost:5173"), 200, "", 0},
		{"a foreign Host", mcpRequest(list, "Host", "evil.example:8080"), 403, "", -32000},
		{"a rebinding Host", mcpRequest(list, "Host", "127.0.0.1.evil.example"), 403, "", -32000},
		{"localhost", mcpRequest(list, "Host", "localhost:8080"), 200, "", 0},
		{"[::1]", mcpRequest(list, "Host", "[::1]:8080"), 200, "", 0},
		{"text/plain", mcpRequest(list, "Content-Type", "text/plain"), 415, "", -32000},
		{"no Content-Type", mcpRequest(list, "Content-Type", ""), 415, "", -32000},
		{"a charset", mcpRequest(list, "Content-Type", "application/json; charset=utf-8"), 200, "", 0},
		{"a batch", mcpRequest(`[` + list + `]`), 400, "", -32600},
		{"unparsable", mcpRequest(`{"jsonrpc":"2.0",`), 400, "", -32700},
		{"not JSON-RPC 2.0", mcpRequest(`{"jsonrpc":"1.0","id":1,"method":"tools/list"}`), 400, "", -32600},
		{"an id of an object", mcpRequest(`{"jsonrpc":"2.0","id":{},"method":"tools/list"}`), 400, "", -32600},
		{"params of a string", mcpRequest(`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":"x"}`), 400, "", -32600},
		{"a notification", mcpRequest(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}`), 202, "", 0},
		{"a response", mcpRequest(`{"jsonrpc":"2.0","id":7,"result":{}}`), 202, "", 0},
		{"256 KiB + 1", mcpRequest(paddedMessage(maxBodyBytes + 1)), 413, "body_too_large", 0},
		{"256 KiB", mcpRequest(paddedMessage(maxBodyBytes)), 200, "", 0},
		{"a session id is ignored", mcpRequest(list, "Mcp-Session-Id", "abc"), 200, "", 0},
		{"an unsupported revision", mcpRequest(list, "MCP-Protocol-Version", "2099-01-01"), 400, "", -32022},
		{"an unknown method", mcpRequest(`{"jsonrpc":"2.0","id":1,"method":"nope"}`), 200, "", -32601},
		{"bearer in lower case", mcpRequest(list, "Authorization", "bearer sk_test_sandbox_all"), 200, "", 0},
		{"BEARER", mcpRequest(list, "Authorization", "BEARER sk_test_sandbox_all"), 200, "", 0},
		{"an id that is not UTF-8", mcpRequest("{\"jsonrpc\":\"2.0\",\"id\":\"\xff\xfe\",\"method\":\"tools/list\"}"), 400, "", -32700},
		{"a string that is not UTF-8", mcpRequest("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"get_order\",\"arguments\":{\"id\":\"\xc3\"}}}"), 400, "", -32700},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rep, a := e.mcp(t, c.r)
			switch {
			case c.code != "":
				wantProblem(t, rep, c.status, c.code, "")
				if c.status == 401 && rep.header.Get("WWW-Authenticate") != `Bearer realm="sandbox"` {
					t.Errorf("a 401 without the Bearer challenge: %v", rep.header)
				}
			case c.rpcCode != 0:
				rpcFault(t, rep, a, c.status, c.rpcCode)
				if c.rpcCode == -32700 || c.rpcCode == -32600 && c.name != "params of a string" {
					if string(a.ID) != "null" {
						t.Errorf("id %s, want null", a.ID)
					}
				}
			case rep.status != c.status:
				t.Errorf("answered %s, want %d", rep, c.status)
			}
		})
	}
	t.Run("an unsupported revision names the supported ones", func(t *testing.T) {
		t.Parallel()
		_, a := e.mcp(t, mcpRequest(list, "MCP-Protocol-Version", "2099-01-01"))
		if data, _ := json.Marshal(a.Error.Data); string(data) != `{"requested":"2099-01-01","supported":["2026-07-28","2025-11-25","2025-06-18","2025-03-26","2024-11-05"]}` {
			t.Errorf("data: %s", data)
		}
		// A legacy revision named in _meta: _meta names the stateless revision only, and the
		// message says how a legacy one is reached.
		body, headers := statelessRequest(1, "tools/list", "", "")
		rep, a := e.mcp(t, mcpRequest(strings.Replace(body, `protocolVersion":"2026-07-28"`, `protocolVersion":"2025-06-18"`, 1), append(headers, "MCP-Protocol-Version", "2025-06-18")...))
		rpcFault(t, rep, a, 400, -32022)
		if data, _ := json.Marshal(a.Error.Data); string(data) != `{"requested":"2025-06-18","supported":["2026-07-28"]}` || !strings.Contains(a.Error.Message, "negotiated by initialize") {
			t.Errorf("a legacy revision in _meta: %s, data %s", a.Error.Message, data)
		}
	})
	t.Run("a method the stateless revision lacks is -32601 whatever its _meta", func(t *testing.T) {
		t.Parallel()
		for _, method := range []string{"ping", "initialize", "prompts/list", "logging/setLevel"} {
			rep, a := e.mcp(t, mcpRequest(`{"jsonrpc":"2.0","id":1,"method":"`+method+`"}`, "MCP-Protocol-Version", "2026-07-28", "Mcp-Method", method))
			rpcFault(t, rep, a, 404, -32601)
		}
	})
	t.Run("the access log names the account a call acts as", func(t *testing.T) {
		t.Parallel()
		logged := newEnv(t, envOptions{rate: -1})
		logged.mcp(t, mcpRequest(list, "Authorization", "bearer sk_test_other_all"))
		logged.do(t, newRequest(http.MethodGet, "/.well-known/oauth-authorization-server", ""))
		for _, want := range []string{`"route":"/mcp","status":200,`, `"account":"acct_other","environment":"test"}`, `"route":"/.well-known/oauth-authorization-server","status":404,`} {
			if !strings.Contains(logged.logs.String(), want) {
				t.Errorf("the access log lacks %s:\n%s", want, logged.logs)
			}
		}
	})
	t.Run("the stateless revision's headers and _meta", func(t *testing.T) {
		t.Parallel()
		call := `{"name":"get_clock","arguments":{}}`
		body, headers := statelessRequest(1, "tools/call", "get_clock", call)
		for _, c := range []struct {
			name    string
			body    string
			headers []string
			status  int
			code    int
		}{
			{"as sent", body, headers, 200, 0},
			{"Mcp-Name in base64", body, append(slices.Clone(headers), "Mcp-Name", "=?base64?"+base64.StdEncoding.EncodeToString([]byte("get_clock"))+"?="), 200, 0},
			{"Mcp-Method unlike the method", body, append(slices.Clone(headers), "Mcp-Method", "tools/list"), 400, -32020},
			{"no Mcp-Method", body, append(slices.Clone(headers), "Mcp-Method", ""), 400, -32020},
			{"Mcp-Name unlike the tool", body, append(slices.Clone(headers), "Mcp-Name", "get_timeline"), 400, -32020},
			{"no Mcp-Name", body, append(slices.Clone(headers), "Mcp-Name", ""), 400, -32020},
			{"Mcp-Name in broken base64", body, append(slices.Clone(headers), "Mcp-Name", "=?base64?***?="), 400, -32020},
			{"MCP-Protocol-Version unlike _meta", body, append(slices.Clone(headers), "MCP-Protocol-Version", "2025-11-25"), 400, -32020},
			{"no MCP-Protocol-Version", body, append(slices.Clone(headers), "MCP-Protocol-Version", ""), 400, -32020},
			{"_meta of an unsupported revision", strings.Replace(body, `protocolVersion":"2026-07-28"`, `protocolVersion":"2099-01-01"`, 1), append(slices.Clone(headers), "MCP-Protocol-Version", "2099-01-01"), 400, -32022},
			{"_meta without the client's capabilities", strings.Replace(body, `,"io.modelcontextprotocol/clientCapabilities":{}`, ``, 1), headers, 400, -32602},
			{"no _meta", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":` + call + `}`, headers, 400, -32602},
			{"an unknown tool", strings.Replace(body, `"name":"get_clock"`, `"name":"nope"`, 1), append(slices.Clone(headers), "Mcp-Name", "nope"), 400, -32602},
		} {
			rep, a := e.mcp(t, mcpRequest(c.body, c.headers...))
			if c.code == 0 {
				if rep.status != c.status || a.Error != nil {
					t.Errorf("%s: %s", c.name, rep.body)
				}
				continue
			}
			t.Run(c.name, func(t *testing.T) { rpcFault(t, rep, a, c.status, c.code) })
		}
	})
	t.Run("GET and DELETE are 405, and OPTIONS without -cors-origin", func(t *testing.T) {
		t.Parallel()
		for _, method := range []string{http.MethodGet, http.MethodDelete, http.MethodPut, http.MethodOptions} {
			rep, _ := e.mcp(t, newRequest(method, "/mcp", "sk_test_sandbox_all"))
			wantProblem(t, rep, 405, "method_not_allowed", "")
			if rep.header.Get("Allow") != "POST" {
				t.Errorf("%s /mcp: Allow %q", method, rep.header.Get("Allow"))
			}
		}
	})
	t.Run("-mcp-key", func(t *testing.T) {
		t.Parallel()
		withKey := newEnv(t, envOptions{rate: -1, mcpKey: "sk_test_sandbox_tracking"})
		if rep, _ := withKey.mcp(t, mcpRequest(list, "Authorization", "")); rep.status != 200 {
			t.Errorf("a loopback client without Authorization, with -mcp-key: %s", rep)
		}
		remote := mcpRequest(list, "Authorization", "")
		remote.RemoteAddr = "192.0.2.7:5000"
		rep, _ := withKey.mcp(t, remote)
		wantProblem(t, rep, 401, "missing_api_key", "")
		// The tools act as -mcp-key: the journal of its account has the call.
		_, a := withKey.mcp(t, mcpRequest(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_order","arguments":{"id":"ord_sbx_0001"}}}`, "Authorization", ""))
		if line := toolLine(a); !strings.HasPrefix(line, "HTTP 403") {
			t.Errorf("get_order as sk_test_sandbox_tracking (no orders:read): %s", line)
		}
	})
	t.Run("CORS", func(t *testing.T) {
		t.Parallel()
		b := newEnv(t, envOptions{rate: -1, cors: "https://app.example"})
		pre := newRequest(http.MethodOptions, "/mcp", "", "Origin", "https://app.example", "Access-Control-Request-Method", "POST", "Access-Control-Request-Headers", "authorization, x-other")
		rep, _ := b.mcp(t, pre)
		if rep.status != 204 || rep.header.Get("Access-Control-Allow-Methods") != "POST" ||
			rep.header.Get("Access-Control-Allow-Headers") != "Authorization, Content-Type, MCP-Protocol-Version, Mcp-Method, Mcp-Name" || rep.header.Get("Access-Control-Allow-Origin") != "https://app.example" {
			t.Errorf("the preflight: %d %v", rep.status, rep.header)
		}
		rep, _ = b.mcp(t, mcpRequest(list, "Origin", "https://app.example"))
		if rep.status != 200 || rep.header.Get("Access-Control-Allow-Origin") != "https://app.example" {
			t.Errorf("-cors-origin's page: %d %v", rep.status, rep.header)
		}
		rep, a := b.mcp(t, mcpRequest(list, "Origin", "https://other.example"))
		rpcFault(t, rep, a, 403, -32000)
	})
	t.Run("a Host of any name when the sandbox listens beyond loopback", func(t *testing.T) {
		t.Parallel()
		remote := newEnv(t, envOptions{rate: -1, remote: true})
		if rep, _ := remote.mcp(t, mcpRequest(list, "Host", "sandbox.lan:8080")); rep.status != 200 {
			t.Errorf("answered %s", rep)
		}
	})
}

// paddedMessage is a tools/list request of exactly n bytes.
func paddedMessage(n int) string {
	head, tail := `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"x":"`, `"}}`
	return head + strings.Repeat("a", n-len(head)-len(tail)) + tail
}

// toolLine is the first line of a tool result's text.
func toolLine(a rpcAnswer) string {
	item := asMap(asSlice(a.Result["content"])[0])
	line, _, _ := strings.Cut(fmt.Sprint(item["text"]), "\n")
	return line
}

// toolOut is a tool's result as the door answered it, checked.
type toolOut struct {
	status     int            // the API's status, from _meta["sandbox/http"]
	line       string         // the text's first line
	body       string         // the text after it: the API's body as answered
	structured map[string]any // structuredContent
	answer     rpcAnswer
}

// callTool calls a tool in the revision 2025-11-25, with the caller's key of both scopes,
// and checks its result: one text item whose first line is the status and the headers a
// client reads, in order, then the body as the API answered it; structuredContent that
// body ({} for none) and valid against the tool's output schema; isError for a status of
// 400 or more; _meta["sandbox/http"] the status, the request id and every header.
func (e *env) callTool(t testing.TB, name, args string) toolOut {
	t.Helper()
	rep, a := e.mcp(t, mcpRequest(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"`+name+`","arguments":`+args+`}}`, "MCP-Protocol-Version", "2025-11-25"))
	if rep.status != 200 || a.Error != nil {
		t.Fatalf("tools/call %s: %s", name, rep.body)
	}
	content := asSlice(a.Result["content"])
	item := asMap(content[0])
	text := fmt.Sprint(item["text"])
	line, body, _ := strings.Cut(text, "\n")
	meta := asMap(asMap(a.Result["_meta"])["sandbox/http"])
	status, _ := strconv.Atoi(fmt.Sprint(meta["status"]))
	headers := asMap(meta["headers"])
	out := toolOut{status: status, line: line, body: body, structured: asMap(a.Result["structuredContent"]), answer: a}
	if len(content) != 1 || item["type"] != "text" || a.Result["isError"] != (status >= 400) || out.structured == nil {
		t.Errorf("tools/call %s: %s", name, rep.body)
	}
	if name != "check_server" || status >= 400 {
		want := "HTTP " + strconv.Itoa(status)
		for _, field := range []string{"Retry-After", "RateLimit", "Location", "Idempotent-Replayed", "Preference-Applied", "Request-Id"} {
			if v, ok := headers[http.CanonicalHeaderKey(field)]; ok {
				want += " · " + field + ": " + fmt.Sprint(v)
			}
		}
		if line != want || meta["request_id"] != headers["Request-Id"] || !requestIDPattern.MatchString(fmt.Sprint(meta["request_id"])) {
			t.Errorf("tools/call %s: the first line %q, want %q (_meta %v)", name, line, want, meta)
		}
	}
	var fromText any = map[string]any{}
	if body != "" {
		dec := json.NewDecoder(strings.NewReader(body))
		dec.UseNumber()
		if err := dec.Decode(&fromText); err != nil {
			t.Fatalf("tools/call %s: the text's body is not JSON: %q", name, body)
		}
	}
	if !reflect.DeepEqual(fromText, any(out.structured)) {
		t.Errorf("tools/call %s: structuredContent %v is not the text's body %s", name, out.structured, body)
	}
	if err := theOpenAPI(t).validate(e.outputSchema(t, name), any(out.structured), "$", nil); err != nil {
		t.Errorf("tools/call %s: the structured content does not hold to the tool's output schema: %v\n%s", name, err, body)
	}
	return out
}

// outputSchema is a tool's output schema as tools/list shows it.
func (e *env) outputSchema(t testing.TB, name string) any {
	t.Helper()
	for _, tool := range e.listedTools(t, "2025-11-25") {
		if tool["name"] == name {
			return tool["outputSchema"]
		}
	}
	t.Fatalf("tools/list has no %s", name)
	return nil
}

// listedTools is tools/list in a revision.
func (e *env) listedTools(t testing.TB, revision string) []map[string]any {
	t.Helper()
	_, a := e.mcp(t, mcpRequest(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, "MCP-Protocol-Version", revision))
	var tools []map[string]any
	for _, x := range asSlice(a.Result["tools"]) {
		tools = append(tools, asMap(x))
	}
	return tools
}

// TestMCPTools: each tool's success and its error result, each the API's own answer (or the
// door's problem for arguments it refuses, or the kit's report), as the door shows it; and
// every tool of the table has both.
func TestMCPTools(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, step: -1})
	shown := map[string][2]bool{} // a tool's success seen, its error seen
	var key, account string       // the sandbox the first call makes
	var exam, examKey string      // the attempt start_exam makes
	call := func(t *testing.T, name, args string, status int, code, param string) toolOut {
		t.Helper()
		out := e.callTool(t, name, strings.NewReplacer("$KEY", key, "$ACCOUNT", account, "$EXAM_KEY", examKey, "$EXAM", exam).Replace(args))
		if out.status != status {
			t.Fatalf("%s %s: %d %s %s, want %d", name, args, out.status, out.line, out.body, status)
		}
		if status >= 400 {
			var p problem
			mustDecode(t, []byte(out.body), &p)
			if string(p.Code) != code || p.paramName() != param {
				t.Errorf("%s %s: the problem %s, want %s with param %q", name, args, out.body, code, param)
			}
		}
		s := shown[name]
		s[min(status/400, 1)] = true
		shown[name] = s
		return out
	}
	steps := []struct {
		name, tool, args string
		status           int
		code, param      string
		check            func(t *testing.T, out toolOut)
	}{
		{"a sandbox made", "create_sandbox", `{"template":"acct_sync","idempotency_key":"mcp-1"}`, 201, "", "", func(t *testing.T, out toolOut) {
			key = fmt.Sprint(asMap(asSlice(out.structured["keys"])[0])["key"])
			account = fmt.Sprint(out.structured["account"])
		}},
		{"the same, replayed", "create_sandbox", `{"template":"acct_sync","idempotency_key":"mcp-1"}`, 201, "", "", func(t *testing.T, out toolOut) {
			if !strings.Contains(out.line, " · Idempotent-Replayed: true · ") || out.structured["account"] != account {
				t.Errorf("a replay: %s %v", out.line, out.structured["account"])
			}
		}},
		{"no idempotency_key", "create_sandbox", `{"template":"acct_sync"}`, 422, "invalid_parameter", "idempotency_key", nil},
		{"a template that is none", "create_sandbox", `{"template":"acct_nope","idempotency_key":"mcp-2"}`, 422, "invalid_parameter", "template", nil},
		{"by id", "get_tracking", `{"shipment_id":"shp_sbx_spring"}`, 200, "", "", nil},
		{"by number, with the sandbox's key", "get_tracking", `{"tracking_number":"SBX1000000001","key":"$KEY"}`, 404, "not_found", "", nil},
		{"both", "get_tracking", `{"shipment_id":"shp_sbx_spring","tracking_number":"SBX1000000001"}`, 422, "invalid_parameter", "shipment_id", nil},
		{"neither", "get_tracking", `{}`, 422, "invalid_parameter", "shipment_id", nil},
		{"an id to escape", "get_tracking", `{"shipment_id":"a/../b?c"}`, 404, "not_found", "", nil},
		{"an empty id", "get_tracking", `{"shipment_id":""}`, 422, "invalid_parameter", "shipment_id", nil},
		{"a simulated 429", "get_tracking", `{"shipment_id":"shp_sbx_spring","prefer":"code=429"}`, 429, "rate_limited", "", func(t *testing.T, out toolOut) {
			if !strings.HasPrefix(out.line, "HTTP 429 · Retry-After: 1 · Preference-Applied: code=429 · Request-Id: req_") {
				t.Errorf("the 429's first line: %s", out.line)
			}
		}},
		{"a page", "list_orders", `{"limit":2,"status":"unfulfilled","key":"$KEY"}`, 200, "", "", func(t *testing.T, out toolOut) {
			if len(asSlice(out.structured["data"])) != 2 || asMap(out.structured["pagination"])["next_cursor"] == nil {
				t.Errorf("a page of 2: %s", out.body)
			}
		}},
		{"a limit given as a string", "list_orders", `{"limit":"3"}`, 200, "", "", nil},
		{"a limit of 0", "list_orders", `{"limit":0}`, 422, "invalid_parameter", "limit", nil},
		{"a member it does not take", "list_orders", `{"page":2}`, 422, "unknown_parameter", "page", nil},
		{"a member sent twice", "list_orders", `{"limit":2,"limit":3}`, 422, "invalid_parameter", "limit", nil},
		{"a cursor of an object", "list_orders", `{"cursor":{}}`, 422, "invalid_parameter", "cursor", nil},
		{"a malformed cursor: a 400 is an error result", "list_orders", `{"cursor":"not-a-cursor"}`, 400, "invalid_cursor", "cursor", nil},
		{"a key with a line break", "list_orders", `{"key":"sk_test_sandbox_all\r\nX: y"}`, 422, "invalid_parameter", "key", nil},
		{"an order", "get_order", `{"id":"ord_sbx_0001"}`, 200, "", "", nil},
		{"no such order", "get_order", `{"id":"ord_nope"}`, 404, "not_found", "", nil},
		{"no id", "get_order", `{}`, 422, "invalid_parameter", "id", nil},
		{"a booking", "book_shipment", `{"key":"$KEY","id":"shp_1","reference":"REF-1","order_id":"ord_sync_0003","idempotency_key":"b-1"}`, 201, "", "", func(t *testing.T, out toolOut) {
			if !strings.Contains(out.line, " · Location: /v1/shipments/shp_1/tracking · ") {
				t.Errorf("the first line names no Location: %s", out.line)
			}
		}},
		{"a second link", "book_shipment", `{"key":"$KEY","id":"shp_2","reference":"REF-2","order_id":"ord_sync_0003","idempotency_key":"b-2"}`, 409, "order_already_linked", "order_id", nil},
		{"a move", "add_shipment_events", `{"key":"$KEY","shipment_id":"shp_1","status":"out_for_delivery","location":"Leeds, GB","idempotency_key":"m-1"}`, 201, "", "", func(t *testing.T, out toolOut) {
			if out.structured["status"] != "out_for_delivery" {
				t.Errorf("the move: %s", out.body)
			}
		}},
		{"events and a status", "add_shipment_events", `{"key":"$KEY","shipment_id":"shp_1","status":"delivered","events":[],"idempotency_key":"m-2"}`, 422, "invalid_parameter", "events", nil},
		{"the clock", "get_clock", `{}`, 200, "", "", nil},
		{"a live key", "get_clock", `{"key":"sk_live_sandbox_all"}`, 503, "live_not_released", "", nil},
		{"a freeze", "set_clock", `{"key":"$KEY","frozen_time":"2026-11-22T12:00:00Z"}`, 200, "", "", nil},
		{"no instant", "set_clock", `{"key":"$KEY"}`, 422, "invalid_parameter", "frozen_time", nil},
		{"the timeline", "get_timeline", `{"key":"$KEY"}`, 200, "", "", nil},
		{"a simulated 503", "get_timeline", `{"key":"$KEY","prefer":"code=503"}`, 503, "provider_unavailable", "", nil},
		{"the journal", "get_requests", `{"key":"$KEY","limit":2}`, 200, "", "", nil},
		{"a limit of 0", "get_requests", `{"key":"$KEY","limit":0}`, 422, "invalid_parameter", "limit", nil},
		{"the findings", "get_findings", `{"key":"$KEY"}`, 200, "", "", nil},
		{"an unknown key", "get_findings", `{"key":"sk_test_nobody"}`, 401, "invalid_api_key", "", nil},
		{"this sandbox checked", "check_server", `{"rules":"auth.*"}`, 200, "", "", func(t *testing.T, out toolOut) {
			s := asMap(out.structured["summary"])
			if fmt.Sprint(s["failed"]) != "0" || fmt.Sprint(s["passed"]) == "0" || out.structured["world"] != "own" || !regexp.MustCompile(`^\d+ rules: \d+ passed, 0 failed \(0 MUST\), \d+ skipped$`).MatchString(out.line) {
				t.Errorf("check_server: %s\n%s", out.line, out.body)
			}
		}},
		{"a server off this machine", "check_server", `{"base_url":"http://example.com/v1"}`, 422, "invalid_parameter", "base_url", nil},
		{"a rule that is none", "check_server", `{"rules":"nope.*"}`, 422, "invalid_parameter", "rules", nil},
		{"the catalogue", "list_exams", `{}`, 200, "", "", func(t *testing.T, out toolOut) {
			if len(asSlice(out.structured["data"])) != 3 {
				t.Errorf("the catalogue: %s", out.body)
			}
		}},
		{"a simulated 503", "list_exams", `{"prefer":"code=503"}`, 503, "provider_unavailable", "", nil},
		{"an attempt, at scale 2", "start_exam", `{"exam":"order-sync","scale":2,"variant":0,"idempotency_key":"x-1"}`, 201, "", "", func(t *testing.T, out toolOut) {
			exam, examKey = fmt.Sprint(out.structured["id"]), fmt.Sprint(out.structured["key"])
			if out.structured["deadline"] != "2026-11-22T12:00:24Z" || fmt.Sprint(out.structured["variant"]) != "0" || !strings.Contains(out.line, " · Location: /v1/test_helpers/exams/"+exam+" · ") {
				t.Errorf("the attempt: %s\n%s", out.line, out.body)
			}
		}},
		{"an exam that is none", "start_exam", `{"exam":"billing","idempotency_key":"x-2"}`, 422, "invalid_parameter", "exam", nil},
		{"its grade, pending", "grade_exam", `{"id":"$EXAM"}`, 200, "", "", func(t *testing.T, out toolOut) {
			if out.structured["state"] != "running" || out.structured["passed"] != nil {
				t.Errorf("the grade: %s", out.body)
			}
		}},
		{"another's grade", "grade_exam", `{"id":"$EXAM","key":"sk_test_other_all"}`, 404, "not_found", "", nil},
		{"an answer before the deadline", "answer_exam", `{"id":"$EXAM","key":"$EXAM_KEY","orders":[],"idempotency_key":"a-1"}`, 409, "exam_running", "", func(t *testing.T, out toolOut) {
			if !strings.HasPrefix(out.line, "HTTP 409 · Retry-After: 24 · Request-Id: req_") {
				t.Errorf("the first line: %s", out.line)
			}
			e.callTool(t, "get_clock", `{"key":"`+examKey+`"}`) // the attempt's clock runs from its key's first request
			e.clock.advance(24 * time.Second)
		}},
		{"both answers", "answer_exam", `{"id":"$EXAM","key":"$EXAM_KEY","orders":[],"consignments":[],"idempotency_key":"a-2"}`, 422, "invalid_parameter", "orders", nil},
		{"an answer", "answer_exam", `{"id":"$EXAM","key":"$EXAM_KEY","orders":[{"id":"ord_exam_0003","status":"unfulfilled","shipment_id":null}],"idempotency_key":"a-3"}`, 200, "", "", func(t *testing.T, out toolOut) {
			if out.structured["state"] != "graded" || out.structured["passed"] != false || out.structured["score"] != "10/12" {
				t.Errorf("the grade: %s", out.body)
			}
		}},
		{"the sandbox forgotten", "delete_sandbox", `{"key":"$KEY","account":"$ACCOUNT"}`, 204, "", "", func(t *testing.T, out toolOut) {
			if out.body != "" || len(out.structured) != 0 {
				t.Errorf("a 204: %q %v", out.body, out.structured)
			}
		}},
		{"its key now", "delete_sandbox", `{"key":"$KEY","account":"$ACCOUNT"}`, 401, "invalid_api_key", "", nil},
	}
	for _, s := range steps {
		t.Run(s.tool+" "+s.name, func(t *testing.T) {
			out := call(t, s.tool, s.args, s.status, s.code, s.param)
			if s.check != nil {
				s.check(t, out)
			}
		})
	}
	for _, tool := range mcpToolTable {
		if s := shown[tool.name]; !s[0] || !s[1] {
			t.Errorf("%s: success shown %v, error shown %v: the test covers both for every tool", tool.name, s[0], s[1])
		}
	}
	t.Run("RateLimit in the first line", func(t *testing.T) {
		limited := newEnv(t, envOptions{})
		if out := limited.callTool(t, "get_clock", `{}`); !regexp.MustCompile(`^HTTP 200 · RateLimit: "default";r=\d+;t=1 · Request-Id: req_`).MatchString(out.line) {
			t.Errorf("the first line: %s", out.line)
		}
	})
	t.Run("the key as the API reads it: bearer in lower case", func(t *testing.T) {
		_, a := e.mcp(t, mcpRequest(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"check_server","arguments":{"rules":"auth.missing_key"}}}`, "Authorization", "bearer sk_test_sandbox_all"))
		if line := toolLine(a); line != "1 rules: 1 passed, 0 failed (0 MUST), 0 skipped" || a.Result["isError"] != false {
			t.Errorf("check_server with bearer in lower case: %s %v", line, a.Result["content"])
		}
		_, a = e.mcp(t, mcpRequest(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_order","arguments":{"id":"ord_sbx_0001"}}}`, "Authorization", "BEARER sk_test_sandbox_all"))
		if line := toolLine(a); !strings.HasPrefix(line, "HTTP 200") {
			t.Errorf("get_order with BEARER: %s", line)
		}
	})
	t.Run("arguments that are not an object", func(t *testing.T) {
		for _, args := range []string{`[]`, `"x"`, `3`} {
			rep, a := e.mcp(t, mcpRequest(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_clock","arguments":`+args+`}}`))
			rpcFault(t, rep, a, 200, -32602)
		}
		rep, a := e.mcp(t, mcpRequest(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"nope"}}`))
		rpcFault(t, rep, a, 200, -32602)
	})
}

// TestRestatedListsAreHeldEqual: the lists written in two places are held equal, each by its
// one source: the shorthand's descriptions in the document's prose; check_server's members
// and the kit's flags (each a flag, its values those the kit takes); the values of the
// report's words and the kit's.
func TestRestatedListsAreHeldEqual(t *testing.T) {
	t.Parallel()
	var doc struct {
		Components struct {
			Schemas map[string]struct{ Description string } `json:"schemas"`
		} `json:"components"`
	}
	mustDecode(t, openAPIDocument, &doc)
	var pairs []string
	for _, st := range trackingStatuses {
		pairs = append(pairs, st+` "`+shorthandDescriptions[st]+`"`)
	}
	if want := "(" + strings.Join(pairs, ", ") + ")"; !strings.Contains(doc.Components.Schemas["ShipmentStatusRequest"].Description, want) {
		t.Errorf("the document's ShipmentStatusRequest does not list the shorthand's descriptions as the code has them: %s", want)
	}
	var usage bytes.Buffer
	parseCheckConfig([]string{"-h"}, func(string) string { return "" }, &usage)
	var check *mcpTool
	for i := range mcpToolTable {
		if mcpToolTable[i].success != nil {
			check = &mcpToolTable[i]
		}
	}
	for _, m := range check.members {
		flagName := strings.ReplaceAll(m.name, "_", "-")
		if !strings.Contains(usage.String(), "  -"+flagName+" ") {
			t.Errorf("check_server's member %s is no flag of the kit", m.name)
		}
		var schema struct{ Enum []string }
		mustDecode(t, []byte(m.inline), &schema)
		for _, v := range schema.Enum {
			if _, err := parseCheckConfig([]string{"-" + flagName, v}, func(string) string { return "" }, io.Discard); err != nil {
				t.Errorf("check_server's %s %q: the kit refuses it: %v", m.name, v, err)
			}
		}
		if _, err := parseCheckConfig([]string{"-" + flagName, "nonsense"}, func(string) string { return "" }, io.Discard); len(schema.Enum) > 0 && err == nil {
			t.Errorf("check_server's %s lists %v, but the kit takes any value", m.name, schema.Enum)
		}
	}
	results := slices.Sorted(maps.Keys(resultMarks))
	if words := slices.Sorted(slices.Values(reportWords["result"])); !slices.Equal(words, results) {
		t.Errorf("the report's results are %v, the kit's %v", words, results)
	}
	for _, name := range []string{"profile", "mode"} {
		var m *mcpMember = check.member(name)
		var schema struct{ Enum []string }
		mustDecode(t, []byte(m.inline), &schema)
		if !slices.Equal(schema.Enum, reportWords[name]) {
			t.Errorf("the report's %s takes %v, check_server's %v", name, reportWords[name], schema.Enum)
		}
	}
}

// TestMCPCheckServerKeepsTheCallersKey: check_server carries the caller's key to this
// sandbox only; another server on this machine is checked with the SANDBOX_CHECK_* keys of
// the sandbox's environment, and never sees the caller's.
func TestMCPCheckServerKeepsTheCallersKey(t *testing.T) {
	t.Parallel()
	other := newEnv(t, envOptions{rate: -1, quiet: true})
	var seen lockedBuffer
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Write([]byte(r.Header.Get("Authorization") + "\n"))
		other.h.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	args := `{"base_url":"` + ts.URL + `/v1","rules":"auth.missing_key,orders.unknown"}`
	without := newEnv(t, envOptions{rate: -1, quiet: true})
	out := without.callTool(t, "check_server", args)
	if out.status != 422 || !strings.Contains(out.body, "SANDBOX_CHECK_KEY") {
		t.Errorf("another server, no SANDBOX_CHECK_KEY: %d %s", out.status, out.body)
	}
	with := newEnv(t, envOptions{rate: -1, quiet: true, getenv: func(name string) string {
		return map[string]string{"SANDBOX_CHECK_KEY": "sk_test_other_all"}[name]
	}})
	out = with.callTool(t, "check_server", args)
	if out.status != 200 || out.line != "2 rules: 2 passed, 0 failed (0 MUST), 0 skipped" {
		t.Errorf("another server, with SANDBOX_CHECK_KEY: %d %s %s", out.status, out.line, out.body)
	}
	if !strings.Contains(seen.String(), "Bearer sk_test_other_all") || strings.Contains(seen.String(), "sk_test_sandbox_all") {
		t.Errorf("the other server saw these keys, the caller's (sk_test_sandbox_all) among them or SANDBOX_CHECK_KEY's missing:\n%s", seen.String())
	}
}

// TestMCPCheckServerAnswersInTime: a check_server call is answered before the listener's
// write timeout: the kit stops judging 5 s before it, and the rules not judged by then are
// skipped saying that the call's time ran out (a result, not an error).
func TestMCPCheckServerAnswersInTime(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: 2, wall: true, quiet: true, writeTimeout: checkServerMargin + 1500*time.Millisecond})
	start := time.Now()
	out := e.callTool(t, "check_server", `{}`)
	took := time.Since(start)
	skipped := 0
	for _, r := range asSlice(out.structured["rules"]) {
		if rule := asMap(r); rule["result"] == "skip" && strings.Contains(fmt.Sprint(rule["reason"]), "the call's time ran out") {
			skipped++
		}
	}
	if out.status != 200 || out.answer.Result["isError"] != false || skipped == 0 {
		t.Errorf("check_server at 2 requests a second, 1.5 s to judge: %d, %d rules skipped as out of time\n%s", out.status, skipped, out.body)
	}
	if took > checkServerMargin+1500*time.Millisecond {
		t.Logf("answered after %v, past the write timeout (a busy machine?)", took)
	}
	if n := e.srv.registry.count(e.srv.now()); n != 0 {
		t.Errorf("%d of the kit's sandboxes left", n)
	}
}

// TestMCPNeverLogs200OfACutAnswer: an answer of the door cut by the listener's write timeout
// is logged as cut (499), never as the 200 it would have been.
func TestMCPNeverLogs200OfACutAnswer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1})
	cfg := defaultConfig()
	cfg.writeTimeout = 200 * time.Millisecond
	ts := httptest.NewUnstartedServer(e.h)
	ts.Config = newHTTPServer(cfg, e.h, slog.New(slog.DiscardHandler))
	ts.Start()
	t.Cleanup(ts.Close)
	r, _ := http.NewRequest(http.MethodPost, ts.URL+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_clock","arguments":{"prefer":"delay=600"}}}`))
	r.Header.Set("Authorization", "Bearer sk_test_sandbox_all")
	r.Header.Set("Content-Type", "application/json")
	if res, err := http.DefaultClient.Do(r); err == nil {
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err == nil {
			t.Fatalf("an answer after the write timeout came whole: %d %s", res.StatusCode, body)
		}
	}
	waitFor(t, "the call's log line", func() bool { return strings.Contains(e.logs.String(), `"route":"/mcp"`) })
	if !strings.Contains(e.logs.String(), `"route":"/mcp","status":499,`) {
		t.Errorf("the log of a cut answer:\n%s", e.logs)
	}
}

// TestMCPCallsAreJournaledAndJudged: a tool's requests are a client's: journaled in the
// key's account with the run they were tagged with, rate-limited, and judged by the
// findings, a trap rehearsed through the door included.
func TestMCPCallsAreJournaledAndJudged(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: 2, step: -1})
	out := e.callTool(t, "create_sandbox", `{"idempotency_key":"j-1"}`)
	key := fmt.Sprint(asMap(asSlice(out.structured["keys"])[0])["key"])
	first := e.callTool(t, "get_tracking", `{"key":"`+key+`","shipment_id":"shp_sbx_spring","run":"agent-1","prefer":"code=503"}`)
	again := e.callTool(t, "get_tracking", `{"key":"`+key+`","shipment_id":"shp_sbx_spring","run":"agent-1"}`)
	if first.status != 503 || again.status != 200 {
		t.Fatalf("the rehearsal: %s, then %s", first.line, again.line)
	}
	if limited := e.callTool(t, "get_tracking", `{"key":"`+key+`","shipment_id":"shp_sbx_spring"}`); limited.status != 429 || !strings.HasPrefix(limited.line, "HTTP 429 · Retry-After: 1 · RateLimit: ") {
		t.Errorf("the rate limit of the key, through the door: %s", limited.line)
	}
	e.clock.advance(2 * time.Second)
	requests := e.callTool(t, "get_requests", `{"key":"`+key+`","run":"agent-1"}`)
	var seen []string
	for _, x := range asSlice(requests.structured["data"]) {
		seen = append(seen, fmt.Sprint(asMap(x)["method"], " ", asMap(x)["target"], " ", asMap(x)["status"]))
	}
	if want := "GET /v1/shipments/shp_sbx_spring/tracking 503,GET /v1/shipments/shp_sbx_spring/tracking 200"; strings.Join(seen, ",") != want {
		t.Errorf("the journal of run agent-1: %s, want %s", strings.Join(seen, ","), want)
	}
	findings := e.callTool(t, "get_findings", `{"key":"`+key+`","run":"agent-1"}`)
	data := asSlice(findings.structured["data"])
	if len(data) != 1 || asMap(data[0])["code"] != "retry_too_soon" {
		t.Errorf("the findings of run agent-1: %s", findings.body)
	}
	// The caller's own journal (sk_test_sandbox_all's account) has the sandbox it made.
	if own := e.journalOf(t, "sk_test_sandbox_all", ""); len(own.Data) == 0 || own.Data[len(own.Data)-1].Target != "/v1/test_helpers/sandboxes" {
		t.Errorf("the caller's journal: %+v", own.Data)
	}
}

// TestMCPSchemas: each tool's input schema is one flat object (no oneOf, anyOf or allOf at
// its top, which hosts refuse; no member beyond its properties; no $ref), each member
// described; each output schema is an object of anyOf a success and a problem, so that a
// problem validates (TestMCPTools validates both of every tool); every keyword is one the
// test file's validator knows; the hints are the contract's.
func TestMCPSchemas(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1})
	tools := e.listedTools(t, "2025-11-25")
	if len(tools) != len(mcpToolTable) {
		t.Fatalf("tools/list lists %d tools, the table %d", len(tools), len(mcpToolTable))
	}
	d := theOpenAPI(t)
	problem := map[string]any{"type": "about:blank", "title": "Not Found", "status": json.Number("404"), "detail": "x", "code": "not_found", "request_id": "req_00000000000000000000"}
	for i, tool := range tools {
		name := fmt.Sprint(tool["name"])
		t.Run(name, func(t *testing.T) {
			if name != mcpToolTable[i].name {
				t.Errorf("tools/list's %dth tool is %s, the table's %s", i, name, mcpToolTable[i].name)
			}
			in, out := asMap(tool["inputSchema"]), asMap(tool["outputSchema"])
			for _, combinator := range []string{"oneOf", "anyOf", "allOf", "not", "$ref"} {
				if _, ok := in[combinator]; ok {
					t.Errorf("the input schema has %s at its top", combinator)
				}
			}
			if in["type"] != "object" || in["additionalProperties"] != false {
				t.Errorf("the input schema is not one closed object: %v", in)
			}
			for member, schema := range asMap(in["properties"]) {
				if asMap(schema)["description"] == nil {
					t.Errorf("the member %s has no description", member)
				}
				if types, ok := asMap(schema)["type"].([]any); ok && (slices.Contains(types, "array") || slices.Contains(types, "object")) {
					t.Errorf("the member %s is of types %v: an array or an object member is of that one type (the Inspector sends a nullable array as a string)", member, types)
				}
			}
			for _, schema := range []any{in, out} {
				raw, _ := json.Marshal(schema)
				if bytes.Contains(raw, []byte(`"$ref"`)) {
					t.Errorf("a $ref is left: %s", raw)
				}
				if err := d.validate(schema, map[string]any{}, "$", nil); err != nil && strings.Contains(err.Error(), "does not know keyword") {
					t.Error(err)
				}
			}
			branches := asSlice(out["anyOf"])
			if out["type"] != "object" || len(branches) != 2 {
				t.Fatalf("the output schema is not an object of anyOf two: %v", out)
			}
			if err := d.validate(out, problem, "$", nil); err != nil {
				t.Errorf("a problem does not hold to the output schema: %v", err)
			}
			if err := d.validate(branches[0], problem, "$", nil); err == nil {
				t.Errorf("a problem holds to the success branch: the two are not told apart")
			}
			hints := asMap(tool["annotations"])
			_, write := asMap(in["properties"])["idempotency_key"]
			if hints["readOnlyHint"] != (!write && name != "set_clock" && name != "delete_sandbox") || hints["destructiveHint"] != (name == "delete_sandbox") ||
				hints["idempotentHint"] != write || hints["openWorldHint"] != (name == "check_server") {
				t.Errorf("the hints: %v", hints)
			}
		})
	}
}

// TestMCPResources: the document (as GET /v1/openapi.json serves it), the README and every
// docs page, each listed with its size in bytes and read whole; another URI refused as each
// revision says.
func TestMCPResources(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1})
	pages, _ := filepath.Glob("docs/*.md")
	want := []string{"sandbox:///openapi.json", "sandbox:///README.md"}
	for _, p := range pages {
		want = append(want, "sandbox:///"+p)
	}
	_, a := e.mcp(t, mcpRequest(`{"jsonrpc":"2.0","id":1,"method":"resources/list"}`, "MCP-Protocol-Version", "2025-11-25"))
	var got []string
	for _, x := range asSlice(a.Result["resources"]) {
		r := asMap(x)
		uri := fmt.Sprint(r["uri"])
		got = append(got, uri)
		_, read := e.mcp(t, mcpRequest(`{"jsonrpc":"2.0","id":2,"method":"resources/read","params":{"uri":"`+uri+`"}}`))
		contents := asSlice(read.Result["contents"])
		text := fmt.Sprint(asMap(contents[0])["text"])
		var served []byte
		if uri == "sandbox:///openapi.json" {
			served = e.get(t, "/v1/openapi.json", "").body
		} else {
			served, _ = os.ReadFile(strings.TrimPrefix(uri, "sandbox:///"))
		}
		if len(contents) != 1 || text != string(served) || fmt.Sprint(r["size"]) != strconv.Itoa(len(served)) || r["name"] == "" || r["title"] == "" || r["title"] == nil ||
			asMap(contents[0])["mimeType"] != r["mimeType"] || (r["mimeType"] != "text/markdown") != (uri == "sandbox:///openapi.json") {
			t.Errorf("%s: listed %v; read %d bytes, served %d", uri, r, len(text), len(served))
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("resources/list: %v\nwant %v", got, want)
	}
	rep, a := e.mcp(t, mcpRequest(`{"jsonrpc":"2.0","id":3,"method":"resources/read","params":{"uri":"sandbox:///etc/passwd"}}`))
	rpcFault(t, rep, a, 200, -32002)
	body, headers := statelessRequest(4, "resources/read", "file:///x", `{"uri":"file:///x"}`)
	rep, a = e.mcp(t, mcpRequest(body, headers...))
	rpcFault(t, rep, a, 400, -32602)
	if _, a := e.mcp(t, mcpRequest(`{"jsonrpc":"2.0","id":1,"method":"resources/list"}`, "MCP-Protocol-Version", "2025-03-26")); asMap(asSlice(a.Result["resources"])[0])["title"] != nil {
		t.Errorf("a title sent to 2025-03-26")
	}
}

// mcpSession is go run . mcp running as a process: its stdin, its answers read line by line
// from stdout (each must be a JSON-RPC answer), and its stderr.
type mcpSession struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	answers chan rpcAnswer
	stderr  *lockedBuffer
	junk    atomic.Value // a line of stdout that is not a JSON-RPC answer
}

func startMCP(t *testing.T, env []string, args ...string) *mcpSession {
	t.Helper()
	bin, err := sandboxBinary()
	if err != nil {
		t.Fatal(err)
	}
	s := &mcpSession{cmd: exec.Command(bin, append([]string{"mcp"}, args...)...), answers: make(chan rpcAnswer, 16), stderr: &lockedBuffer{}}
	s.cmd.Env = append(os.Environ(), env...)
	s.cmd.Stderr = s.stderr
	s.stdin, _ = s.cmd.StdinPipe()
	stdout, _ := s.cmd.StdoutPipe()
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.cmd.Process.Kill(); s.cmd.Wait() })
	go func() {
		defer close(s.answers)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 8<<20)
		for sc.Scan() {
			var a rpcAnswer
			var compact bytes.Buffer
			dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
			dec.DisallowUnknownFields()
			if dec.Decode(&a) != nil || a.JSONRPC != "2.0" || a.ID == nil || (a.Result == nil) == (a.Error == nil) ||
				json.Compact(&compact, sc.Bytes()) != nil || !bytes.Equal(compact.Bytes(), sc.Bytes()) { // one line of compact JSON
				s.junk.Store(sc.Text())
				continue
			}
			s.answers <- a
		}
	}()
	return s
}

func (s *mcpSession) send(t *testing.T, line string) {
	t.Helper()
	if _, err := io.WriteString(s.stdin, line+"\n"); err != nil {
		t.Fatal(err)
	}
}

// next is the next answer, by its id.
func (s *mcpSession) next(t *testing.T) rpcAnswer {
	t.Helper()
	select {
	case a, ok := <-s.answers:
		if !ok {
			t.Fatalf("stdout ended; stderr: %s", s.stderr)
		}
		return a
	case <-time.After(20 * time.Second):
		t.Fatalf("no answer in 20 s; stderr: %s", s.stderr)
	}
	return rpcAnswer{}
}

// end closes stdin and waits for the exit status.
func (s *mcpSession) end(t *testing.T) int {
	t.Helper()
	s.stdin.Close()
	_, status := waitExit(t, s.cmd, time.Now(), 20*time.Second)
	if junk := s.junk.Load(); junk != nil {
		t.Errorf("stdout held a line that is not a JSON-RPC answer: %q", junk)
	}
	return status
}

// TestMCPOverStdio: go run . mcp in a real process: the sandbox it starts on a free port,
// its start lines on stderr and nothing but JSON-RPC on stdout; a request it cannot deliver
// answered with an error for its id; end of input exits 0; a refused key exits 2; the bridge
// to a running sandbox, and a request it cannot deliver once that sandbox is gone.
func TestMCPOverStdio(t *testing.T) {
	t.Parallel()
	t.Run("its own sandbox", func(t *testing.T) {
		t.Parallel()
		s := startMCP(t, nil, "-rate", "0")
		s.send(t, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
		if a := s.next(t); a.Result["protocolVersion"] != "2025-06-18" {
			t.Fatalf("initialize: %+v", a)
		}
		s.send(t, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
		s.send(t, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"get_tracking","arguments":{"shipment_id":"shp_sbx_spring"}}}`)
		a := s.next(t)
		if _, structured := a.Result["structuredContent"]; string(a.ID) != "2" || !strings.HasPrefix(toolLine(a), "HTTP 200 · Request-Id: req_") || !structured {
			t.Errorf("tools/call in the revision initialize settled (2025-06-18: structured): %+v", a)
		}
		s.send(t, `{"jsonrpc":"2.0","id":"big","method":"tools/call","params":{"name":"get_clock","arguments":{"x":"`+strings.Repeat("a", maxBodyBytes)+`"}}}`)
		if a := s.next(t); string(a.ID) != `"big"` || a.Error == nil || a.Error.Code != -32603 || !strings.Contains(a.Error.Message, "256 KiB") {
			t.Errorf("a line over 256 KiB: %+v", a)
		}
		// The official TypeScript SDK writes id last: found past the cut, past nested ids.
		s.send(t, `{"jsonrpc":"2.0","method":"tools/call","params":{"name":"book_shipment","arguments":{"reference":"`+strings.Repeat("r", maxBodyBytes)+`","events":[{"id":7}]}},"id":"la\u0073t"}`)
		if a := s.next(t); string(a.ID) != `"la\u0073t"` || a.Error == nil || a.Error.Code != -32603 || !strings.Contains(a.Error.Message, "256 KiB") {
			t.Errorf("a line over 256 KiB, its id last: %+v", a)
		}
		body, _ := statelessRequest(3, "server/discover", "", "")
		s.send(t, body)
		if a := s.next(t); string(a.ID) != "3" || a.Result["resultType"] != "complete" {
			t.Errorf("server/discover over stdio: %+v", a)
		}
		body, _ = statelessRequest(4, "resources/read", "", `{"uri":"sandbox:///docs/mcp.md"}`) // Mcp-Name mirrored by the bridge, as the door's rule says
		s.send(t, body)
		if a := s.next(t); string(a.ID) != "4" || a.Error != nil || len(asSlice(a.Result["contents"])) != 1 {
			t.Errorf("resources/read of the stateless revision over stdio: %+v", a)
		}
		s.send(t, `not json`)
		if a := s.next(t); string(a.ID) != "null" || a.Error == nil || a.Error.Code != -32700 {
			t.Errorf("a line that is not JSON: %+v", a)
		}
		if status := s.end(t); status != 0 {
			t.Errorf("end of input: exit %d, want 0; stderr: %s", status, s.stderr)
		}
		if !regexp.MustCompile(`http://127\.0\.0\.1:\d+/v1`).MatchString(s.stderr.String()) {
			t.Errorf("stderr names no base URL: %s", s.stderr)
		}
	})
	t.Run("a refused SANDBOX_MCP_KEY exits 2", func(t *testing.T) {
		t.Parallel()
		for _, key := range []string{"sk_test_nobody", "sk_live_sandbox_all"} {
			s := startMCP(t, []string{"SANDBOX_MCP_KEY=" + key})
			if _, status := waitExit(t, s.cmd, time.Now(), 20*time.Second); status != 2 || !strings.Contains(s.stderr.String(), "sandbox mcp: SANDBOX_MCP_KEY: the sandbox at http://127.0.0.1:") {
				t.Errorf("%s: exit %d; stderr: %s", key, status, s.stderr)
			}
		}
	})
	t.Run("the bridge's start check takes a 200 only", func(t *testing.T) {
		t.Parallel()
		_, base := startServing(t)
		s := startMCP(t, nil, "-base-url", strings.TrimSuffix(base, "/v1"))
		if _, status := waitExit(t, s.cmd, time.Now(), 20*time.Second); status != 2 || !strings.Contains(s.stderr.String(), "answered 404 route_not_found") || !strings.Contains(s.stderr.String(), "is /v1 missing?") {
			t.Errorf("-base-url without /v1: exit %d; stderr: %s", status, s.stderr)
		}
		stall := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "100")
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
			<-r.Context().Done() // headers, then a body that never comes
		}))
		t.Cleanup(stall.Close)
		s = startMCP(t, nil, "-base-url", stall.URL+"/v1")
		time.Sleep(time.Second)
		s.cmd.Process.Signal(syscall.SIGTERM)
		if _, status := waitExit(t, s.cmd, time.Now(), 20*time.Second); status != 2 || !strings.Contains(s.stderr.String(), "answered 200, but its body did not arrive whole") {
			t.Errorf("a start check whose body stalls, then SIGTERM: exit %d; stderr: %s", status, s.stderr)
		}
	})
	t.Run("the bridge at the end of input: a request its sandbox never answers is answered", func(t *testing.T) {
		t.Parallel()
		_, base := startServing(t)
		target, _ := url.Parse(strings.TrimSuffix(base, "/v1"))
		proxy := httputil.NewSingleHostReverseProxy(target)
		stall := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/mcp" {
				proxy.ServeHTTP(w, r)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}))
		t.Cleanup(stall.Close)
		s := startMCP(t, nil, "-base-url", stall.URL+"/v1")
		s.send(t, `{"jsonrpc":"2.0","id":9,"method":"tools/list"}`)
		status := s.end(t)
		a := s.next(t)
		if status != 0 || string(a.ID) != "9" || a.Error == nil || a.Error.Code != -32603 || !strings.Contains(a.Error.Message, "had not arrived when the session ended") ||
			!strings.Contains(s.stderr.String(), "1 requests were still waiting for the sandbox at "+stall.URL+"/v1 when the session ended") || strings.Contains(s.stderr.String(), "standard output") {
			t.Errorf("exit %d, %+v; stderr: %s", status, a, s.stderr)
		}
	})
	t.Run("the bridge", func(t *testing.T) {
		t.Parallel()
		cmd, base := startServing(t)
		status, body := httpGet(t, base+"/test_helpers/clock", "Bearer sk_test_sandbox_all")
		if status != 200 {
			t.Fatalf("the sandbox: %d %s", status, body)
		}
		s := startMCP(t, nil, "-base-url", base)
		s.send(t, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_clock","arguments":{}}}`)
		if a := s.next(t); !strings.HasPrefix(toolLine(a), "HTTP 200") {
			t.Errorf("through the bridge: %+v", a)
		}
		cmd.Process.Kill()
		cmd.Wait()
		s.send(t, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"get_clock","arguments":{}}}`)
		if a := s.next(t); string(a.ID) != "2" || a.Error == nil || a.Error.Code != -32603 || !strings.Contains(a.Error.Message, "cannot be reached") {
			t.Errorf("the sandbox gone: %+v", a)
		}
		s.send(t, `{"jsonrpc":"2.0","method":"notifications/initialized"}`) // undeliverable, and no answer: said on stderr
		if status := s.end(t); status != 0 {
			t.Errorf("end of input: exit %d", status)
		}
		if !strings.Contains(s.stderr.String(), "a notification (notifications/initialized) was not delivered") {
			t.Errorf("stderr: %s", s.stderr)
		}
	})
	t.Run("a bridge's key refused mid-session", func(t *testing.T) {
		t.Parallel()
		_, base := startServing(t)
		res, err := http.DefaultClient.Do(mustRequest(t, http.MethodPost, base+"/test_helpers/sandboxes", `{}`, "Authorization", "Bearer sk_test_sandbox_all", "Content-Type", "application/json", "Idempotency-Key", "stdio-1"))
		if err != nil {
			t.Fatal(err)
		}
		var sb sandboxOut
		json.NewDecoder(res.Body).Decode(&sb)
		res.Body.Close()
		s := startMCP(t, []string{"SANDBOX_MCP_KEY=" + sb.Keys[0].Key}, "-base-url", base)
		s.send(t, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"delete_sandbox","arguments":{"account":"`+sb.Account+`"}}}`)
		if a := s.next(t); !strings.HasPrefix(toolLine(a), "HTTP 204") {
			t.Errorf("the sandbox deleted: %+v", a)
		}
		s.send(t, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
		if a := s.next(t); a.Error == nil || a.Error.Code != -32603 || !strings.Contains(a.Error.Message, "401 invalid_api_key") {
			t.Errorf("a 401 of the door: %+v", a)
		}
		if status := s.end(t); status != 0 {
			t.Errorf("end of input: exit %d", status)
		}
	})
}

// TestMCPOverStdioEveryAnswerIsOneLine: over stdio every answer of every tool (its success
// and, for check_server, the whole report, the largest), resource and method is one line of
// compact JSON: hosts frame stdio by newlines. A tool of the table without a call here fails.
func TestMCPOverStdioEveryAnswerIsOneLine(t *testing.T) {
	t.Parallel()
	s := startMCP(t, nil, "-rate", "0")
	id := 0
	ask := func(t *testing.T, method, params string) rpcAnswer {
		t.Helper()
		id++
		s.send(t, `{"jsonrpc":"2.0","id":`+strconv.Itoa(id)+`,"method":"`+method+`","params":`+cmp.Or(params, "{}")+`}`)
		a := s.next(t)
		if string(a.ID) != strconv.Itoa(id) {
			t.Fatalf("%s: the answer of id %s, want %d", method, a.ID, id)
		}
		return a
	}
	ask(t, "initialize", `{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}`)
	made := ask(t, "tools/call", `{"name":"create_sandbox","arguments":{"template":"acct_sync","idempotency_key":"one-line"}}`)
	sb := asMap(made.Result["structuredContent"])
	key, account := fmt.Sprint(asMap(asSlice(sb["keys"])[0])["key"]), fmt.Sprint(sb["account"])
	calls := map[string]string{
		"create_sandbox":      `{"template":"acct_sync","idempotency_key":"one-line"}`,
		"get_tracking":        `{"shipment_id":"shp_sbx_spring"}`,
		"list_orders":         `{"limit":100}`,
		"get_order":           `{"id":"ord_sbx_0001"}`,
		"book_shipment":       `{"key":"` + key + `","id":"shp_line","reference":"R","order_id":"ord_sync_0003","idempotency_key":"b-1"}`,
		"add_shipment_events": `{"key":"` + key + `","shipment_id":"shp_line","status":"delivered","idempotency_key":"m-1"}`,
		"get_clock":           `{}`,
		"set_clock":           `{"key":"` + key + `","frozen_time":null}`,
		"get_timeline":        `{}`,
		"get_requests":        `{"limit":1000}`,
		"get_findings":        `{}`,
		"check_server":        `{}`,
		"list_exams":          `{}`,
		"start_exam":          `{"exam":"tracking","idempotency_key":"x-1"}`,
		"grade_exam":          `{"id":"$EXAM"}`,
		"answer_exam":         `{"id":"$EXAM","key":"$EXAM_KEY","consignments":[],"idempotency_key":"a-1"}`,
		"delete_sandbox":      `{"key":"` + key + `","account":"` + account + `"}`,
	}
	tools := slices.Clone(mcpToolTable)
	last := func(tool mcpTool) int { return map[bool]int{true: 1}[tool.name == "delete_sandbox"] }
	slices.SortStableFunc(tools, func(a, b mcpTool) int { return cmp.Compare(last(a), last(b)) })
	var exam, examKey string // the attempt start_exam makes
	for _, tool := range tools {
		args, ok := calls[tool.name]
		if !ok {
			t.Errorf("the tool %s has no call in this test", tool.name)
			continue
		}
		args = strings.NewReplacer("$EXAM_KEY", examKey, "$EXAM", exam).Replace(args)
		a := ask(t, "tools/call", `{"name":"`+tool.name+`","arguments":`+args+`}`)
		if started := asMap(a.Result["structuredContent"]); tool.name == "start_exam" {
			exam, examKey = fmt.Sprint(started["id"]), fmt.Sprint(started["key"])
		}
		// An answer before its attempt's deadline is 409, an error result: one line all the same.
		if wantError := tool.name == "answer_exam"; a.Result["isError"] != wantError {
			t.Errorf("%s: %v", tool.name, a.Result["content"])
		}
	}
	for _, r := range []string{"sandbox:///openapi.json", "sandbox:///README.md", "sandbox:///docs/mcp.md"} {
		ask(t, "resources/read", `{"uri":"`+r+`"}`)
	}
	for _, method := range []string{"tools/list", "resources/list", "resources/templates/list", "ping", "nope"} {
		ask(t, method, "")
	}
	body, _ := statelessRequest(id+1, "server/discover", "", "")
	id++
	s.send(t, body)
	s.next(t)
	if status := s.end(t); status != 0 { // end fails the test on any line that is not one compact JSON-RPC answer
		t.Errorf("exit %d; stderr: %s", status, s.stderr)
	}
}

// TestIDFinder: a line's top-level id, wherever it stands, read a chunk at a time: not an id
// nested in its params, not an object or a list, the last when given twice.
func TestIDFinder(t *testing.T) {
	t.Parallel()
	for line, want := range map[string]string{
		`{"id":1,"method":"x"}`: `1`,
		`{"method":"x","params":{"id":7,"a":[{"id":8}]},"id":"last"}`: `"last"`,
		`{"params":{"x":"}\"id\":9,"},"id":-2.5e3}`:                   `-2.5e3`,
		`{"\u0069d":"escaped name","method":"x"}`:                     `"escaped name"`,
		`{"id":{"a":1}}`:      ``,
		`{"id":[1]}`:          ``,
		`{"id":null}`:         ``,
		`{"id":"a","id":"b"}`: `"b"`,
		`{"id":"q\"uote}"}`:   `"q\"uote}"`,
		`["id",1]`:            ``,
		`{"method":"x","params":{"r":"` + strings.Repeat("a", 100) + `"}`: ``,
	} {
		for _, chunk := range []int{1, 7, 4096} {
			var f idFinder
			for b := []byte(line); len(b) > 0; b = b[min(chunk, len(b)):] {
				f.feed(b[:min(chunk, len(b))])
			}
			if string(f.id) != want {
				t.Errorf("the id of %s, in chunks of %d: %s, want %s", line, chunk, f.id, want)
			}
		}
	}
}

// startServing starts the sandbox binary and returns it once it serves, with its base URL.
func startServing(t *testing.T) (*exec.Cmd, string) {
	t.Helper()
	cmd, stdout := startProcess(t, io.Discard)
	var base string
	waitFor(t, "the sandbox's banner", func() bool {
		base = regexp.MustCompile(`http://127\.0\.0\.1:\d+/v1`).FindString(stdout.String())
		return base != ""
	})
	return cmd, base
}

// TestMCPBridgeAnswersEveryID: whatever stands behind the bridge (a sandbox gone, a 401, a
// 413, a 5xx, an answer that is not JSON-RPC, one for another id, a 202 to a request, a body
// that stalls, is not UTF-8 or is over 4 MiB), a request gets one JSON-RPC error for its id on
// stdout, -32603 with the reason and never the key, and a notification gets nothing there
// (its reason goes to stderr): stdout carries nothing but JSON-RPC, one compact line a
// message, an upstream's answer re-encoded so.
func TestMCPBridgeAnswersEveryID(t *testing.T) {
	t.Parallel()
	const key = "sk_test_q2w3e4r5t6y7u2i3"
	answer := func(status int, contentType, body string) bridgeTransport {
		return func(*http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: status, Header: http.Header{"Content-Type": {contentType}}, Body: io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body))}, nil
		}
	}
	problem := func(status int, code string) bridgeTransport {
		return answer(status, "application/problem+json", `{"type":"about:blank","status":`+strconv.Itoa(status)+`,"detail":"why","code":"`+code+`"}`)
	}
	stalled := func(*http.Request) (*http.Response, error) {
		r, _ := io.Pipe() // never written: the body stalls
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}}, Body: r, ContentLength: -1}, nil
	}
	huge := func(*http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(io.MultiReader(strings.NewReader(`{"jsonrpc":"2.0","id":"x-1","result":{"x":"`), zeros{})), ContentLength: -1}, nil
	}
	for _, c := range []struct {
		name string
		rt   bridgeTransport
		why  string // "": the request is answered, with the line want
		want string
	}{
		{"the sandbox gone", func(*http.Request) (*http.Response, error) { return nil, errors.New("connect: connection refused") }, "cannot be reached: connect: connection refused", ""},
		{"a 401", problem(401, "invalid_api_key"), "the sandbox answered 401 invalid_api_key: why", ""},
		{"a 413", problem(413, "body_too_large"), "the sandbox answered 413 body_too_large: why", ""},
		{"a 500", problem(500, "internal_error"), "the sandbox answered 500 internal_error: why", ""},
		{"a 502 of a proxy, in HTML", answer(502, "text/html", "<h1>Bad Gateway</h1>"), "the sandbox answered 502: Bad Gateway", ""},
		{"JSON that is not JSON-RPC", answer(200, "application/json", `{"hello":"world"}`), `not one JSON-RPC response: no "jsonrpc":"2.0"`, ""},
		{"a bare message", answer(200, "application/json", `{"jsonrpc":"2.0"}`), "neither or both of result and error", ""},
		{"both result and error", answer(200, "application/json", `{"jsonrpc":"2.0","id":"x-1","result":{},"error":{}}`), "neither or both of result and error", ""},
		{"another id", answer(200, "application/json", `{"jsonrpc":"2.0","id":"x-2","result":{}}`), `another id ("x-2")`, ""},
		{"a 202 to a request", answer(202, "application/json", ``), "202 Accepted, with no answer to the request", ""},
		{"not UTF-8", answer(200, "application/json", "{\"jsonrpc\":\"2.0\",\"id\":\"x-1\",\"result\":{\"a\":\"\xff\"}}"), "not UTF-8", ""},
		{"over 4 MiB", huge, "over 4194304 bytes (4 MiB)", ""},
		{"over 4 MiB, as declared", answer(200, "application/json", strings.Repeat(" ", 4<<20+1)), "over 4194304 bytes (4 MiB)", ""},
		{"a body that stalls", stalled, "its body did not arrive within 200ms", ""},
		{"a detail that echoes the key", answer(401, "application/problem+json", `{"code":"invalid_api_key","detail":"bad key `+key+` (`+key[:12]+`) \u001b[2J"}`), "bad key $SANDBOX_MCP_KEY ([key])", ""},
		{"an answer spread over lines", answer(200, "application/json", "{\n  \"jsonrpc\": \"2.0\",\n  \"id\": \"x-1\",\n  \"result\": {\n    \"tools\": []\n  }\n}"), "", `{"jsonrpc":"2.0","id":"x-1","result":{"tools":[]}}`},
		{"an error for an id it could not read", answer(400, "application/json", `{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"m"}}`), "", `{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"m"}}`},
	} {
		t.Run(caseName(c.name), func(t *testing.T) {
			t.Parallel()
			var out, said lockedBuffer
			b := newMCPBridge("http://127.0.0.1:1/v1", c.rt, false, key, &out, func(s string) { said.Write([]byte(s + "\n")) })
			b.exchange = 200 * time.Millisecond
			b.carry(context.Background(), stdinLine{text: []byte(`{"jsonrpc":"2.0","id":"x-1","method":"tools/list"}`)})
			var a rpcAnswer
			lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
			switch {
			case len(lines) != 1 || json.Unmarshal([]byte(lines[0]), &a) != nil || strings.Contains(out.String(), key[:8]):
				t.Errorf("stdout: %q, want one JSON-RPC line holding no key", out.String())
			case c.why == "" && lines[0] != c.want:
				t.Errorf("stdout: %s, want %s", lines[0], c.want)
			case c.why != "" && (string(a.ID) != `"x-1"` || a.Error == nil || a.Error.Code != -32603 || !strings.Contains(a.Error.Message, c.why)):
				t.Errorf("stdout: %q, want one -32603 for x-1 saying %q", out.String(), c.why)
			}
			if c.why != "" && c.want == "" {
				b.carry(context.Background(), stdinLine{text: []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)})
				if out.String() != lines[0]+"\n" || c.name != "a 202 to a request" && !strings.Contains(said.String(), "a notification (notifications/initialized) was not delivered") ||
					strings.Contains(said.String(), key[:8]) || strings.Contains(said.String(), "\x1b") {
					t.Errorf("a notification: stdout %q, stderr %q", out.String(), said.String())
				}
			}
		})
	}
}

// zeros is a body that never ends.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) { return len(p), nil }

// TestMCPBridgeHoldsAtMost64MiB: another sandbox's answers are read within the bridge's
// budget, every copy of each counted (bridgeCopies of its size: the body, its members, their
// encoding, the line): of twenty answers of 4 MiB in flight at once, two are read (48 MiB of
// the 64; a third would pass it) and the rest wait for room; each is answered once room is
// made. Counting one copy of each, sixteen were read at once, and 64 of them held 433 to 464
// MiB resident.
func TestMCPBridgeHoldsAtMost64MiB(t *testing.T) {
	t.Parallel()
	var reading atomic.Int64
	release := make(chan struct{})
	rt := bridgeTransport(func(*http.Request) (*http.Response, error) {
		body := io.MultiReader(readerFunc(func(p []byte) (int, error) { // its first read says it is being read, then waits
			reading.Add(1)
			<-release
			return 0, io.EOF
		}))
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(body), ContentLength: 4 << 20}, nil
	})
	var out lockedBuffer
	b := newMCPBridge("http://127.0.0.1:1/v1", rt, false, "sk_test_sandbox_all", &out, func(string) {})
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b.carry(context.Background(), stdinLine{text: []byte(`{"jsonrpc":"2.0","id":` + strconv.Itoa(i) + `,"method":"tools/list"}`)})
		}()
	}
	want := int64(bridgeHeld / (bridgeCopies * (4 << 20)))
	waitFor(t, "answers read at once", func() bool { return reading.Load() >= want })
	time.Sleep(100 * time.Millisecond) // room for one more, were there any
	if n := reading.Load(); n != want || want != 2 {
		t.Errorf("%d answers of 4 MiB read at once, want %d (each counted %d times, within 64 MiB)", n, want, bridgeCopies)
	}
	close(release)
	wg.Wait()
	if n := strings.Count(out.String(), "\n"); n != 20 {
		t.Errorf("%d answers written, want 20", n)
	}
}

// readerFunc is a reader of a function.
type readerFunc func(p []byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// bridgeTransport stands behind the bridge in TestMCPBridgeAnswersEveryID.
type bridgeTransport func(*http.Request) (*http.Response, error)

func (f bridgeTransport) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestMCPOverStdioWayOut: go run . mcp's way out is bounded whatever its outputs do. At the
// end of input a request in flight is answered and the exit is 0; a stdout that stalls (an
// answer stuck in a pipe nobody reads) gives up after the drain's 10 s and exits 1, saying
// so; a stdout that is closed ends the session at once, exit 1, not SIGPIPE; and with stdout
// and stderr both stalled and every core busy, SIGTERM ends it within 15 s.
func TestMCPOverStdioWayOut(t *testing.T) {
	t.Parallel()
	bin, err := sandboxBinary()
	if err != nil {
		t.Fatal(err)
	}
	start := func(t *testing.T, stdout, stderr io.Writer) (*exec.Cmd, io.WriteCloser) {
		t.Helper()
		cmd := exec.Command(bin, "mcp", "-rate", "0")
		cmd.Stdout, cmd.Stderr = stdout, stderr
		stdin, _ := cmd.StdinPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd, stdin
	}
	list := `{"jsonrpc":"2.0","id":1,"method":"tools/list"}` + "\n" // 55 KB: more than a full pipe takes
	t.Run("a request in flight at the end of input is answered", func(t *testing.T) {
		t.Parallel()
		stdout, stderr := &lockedBuffer{}, &lockedBuffer{}
		cmd, stdin := start(t, stdout, stderr)
		io.WriteString(stdin, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"get_clock","arguments":{"prefer":"delay=1500"}}}`+"\n")
		stdin.Close()
		if _, status := waitExit(t, cmd, time.Now(), 15*time.Second); status != 0 || !strings.HasPrefix(stdout.String(), `{"jsonrpc":"2.0","id":7,"result":`) {
			t.Errorf("exit %d, stdout %.80s; stderr: %s", status, stdout, stderr)
		}
	})
	t.Run("a stdout that stalls", func(t *testing.T) {
		t.Parallel()
		stderr := &lockedBuffer{}
		cmd, stdin := start(t, stalledPipe(t), stderr)
		io.WriteString(stdin, list)
		time.Sleep(200 * time.Millisecond) // its answer stuck in the pipe
		stdin.Close()
		took, status := waitExit(t, cmd, time.Now(), 15*time.Second)
		if status != 1 || !strings.Contains(stderr.String(), "sandbox mcp: 1 answers were not written") {
			t.Errorf("exit %d after %v; stderr: %s", status, took, stderr)
		}
	})
	t.Run("a stdout that is closed", func(t *testing.T) {
		t.Parallel()
		stderr := &lockedBuffer{}
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		r.Close()
		cmd, stdin := start(t, w, stderr)
		w.Close()
		io.WriteString(stdin, list)
		if _, status := waitExit(t, cmd, time.Now(), 15*time.Second); status != 1 || !strings.Contains(stderr.String(), "standard output refused an answer") {
			t.Errorf("exit %d (a SIGPIPE is -1); stderr: %s", status, stderr)
		}
	})
	t.Run("every output stalled, every core busy, SIGTERM", func(t *testing.T) {
		stalled := stalledPipe(t)
		cmd, stdin := start(t, stalled, stalled)
		defer stdin.Close()
		busyCores(t)
		io.WriteString(stdin, list)
		time.Sleep(time.Second) // the sandbox up, its answer stuck
		cmd.Process.Signal(syscall.SIGTERM)
		signalled := time.Now()
		took, _ := waitExit(t, cmd, signalled, 15*time.Second+loadedMargin)
		t.Logf("exited %v after SIGTERM (the bound: 15 s)", took)
		if took > 15*time.Second+loadedMargin {
			t.Errorf("exited %v after SIGTERM, want within 15 s and the margin of a busy machine", took)
		}
	})
}

// mustRequest is a request with a body and header pairs.
func mustRequest(t *testing.T, method, url, body string, headerPairs ...string) *http.Request {
	t.Helper()
	r, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headerPairs); i += 2 {
		r.Header.Set(headerPairs[i], headerPairs[i+1])
	}
	return r
}

// TestMCPDocsPage: docs/mcp.md's table of tools is the door's table (each tool's name,
// title, arguments with the required marked and the rule between two, hints), its hosts'
// configurations are what the hosts read, and its Inspector session runs as written and
// prints what the page shows: the Inspector itself needs Node.js, which go test does not
// assume, so a stand-in of its command line (one JSON-RPC request a run, its result printed as
// JSON) takes its place; the session was run with the real Inspector too.
func TestMCPDocsPage(t *testing.T) {
	t.Parallel()
	text, err := os.ReadFile("docs/mcp.md")
	if err != nil {
		t.Fatal(err)
	}
	page := string(text)
	t.Run("the table of tools", func(t *testing.T) {
		t.Parallel()
		var want []string
		for _, tool := range mcpToolTable {
			var args []string
			asClient := slices.ContainsFunc(tool.members, func(m mcpMember) bool { return m.in == "tag" }) // the page says these take key, prefer and run
			for _, m := range tool.members {
				if asClient && (m.in == "key" || m.in == "prefer" || m.in == "tag") {
					continue
				}
				name := "`" + m.name + "`"
				if m.required {
					name += "!"
				}
				args = append(args, name)
			}
			list := strings.Join(args, ", ")
			if len(tool.exactlyOne) == 2 {
				list += " (one of the two)"
			}
			var hints []string
			for _, h := range []struct {
				on   bool
				name string
			}{{tool.readOnly, "read-only"}, {tool.destructive, "destructive"}, {tool.idempotent, "idempotent"}, {tool.openWorld, "open world"}} {
				if h.on {
					hints = append(hints, h.name)
				}
			}
			row := fmt.Sprintf("| `%s` | %s | %s | %s |", tool.name, tool.title, list, strings.Join(hints, ", "))
			want = append(want, strings.ReplaceAll(row, "|  |", "| |")) // an empty cell
		}
		got := regexp.MustCompile("(?m)^\\| `[a-z_]+` \\|.*\\|$").FindAllString(page, -1)
		if !slices.Equal(got, want) {
			t.Errorf("docs/mcp.md's table of tools:\n%s\nthe door's table:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	})
	t.Run("the hosts' configurations", func(t *testing.T) {
		t.Parallel()
		blocks := regexp.MustCompile("(?s)```json\n(.*?)```").FindAllStringSubmatch(page, -1)
		if len(blocks) != 2 {
			t.Fatalf("%d JSON blocks, want VS Code's and Cursor's", len(blocks))
		}
		for i, top := range []string{"servers", "mcpServers"} {
			var config map[string]map[string]struct {
				Type    string   `json:"type"`
				Command string   `json:"command"`
				Args    []string `json:"args"`
			}
			if err := json.Unmarshal([]byte(blocks[i][1]), &config); err != nil || len(config) != 1 {
				t.Fatalf("%s: %v", blocks[i][1], err)
			}
			s, ok := config[top]["shipping-api-sandbox"]
			if !ok || !strings.HasSuffix(s.Command, "/bin/shipping-api-sandbox") || !slices.Equal(s.Args, []string{"mcp"}) || (i == 0) != (s.Type == "stdio") {
				t.Errorf("%s's configuration: %+v", top, config)
			}
		}
		if !strings.Contains(page, "claude mcp add shipping-api-sandbox -- \"$HOME/bin/shipping-api-sandbox\" mcp\n") ||
			!strings.Contains(page, "go build -o \"$HOME/bin/shipping-api-sandbox\" .\n") {
			t.Error("Claude Code's command, or the build of the binary it names, is not on the page")
		}
	})
	t.Run("the Inspector session", func(t *testing.T) {
		t.Parallel()
		needTools(t, "bash", "curl", "jq")
		var session []string
		for _, b := range shellBlocks(page) {
			if strings.Contains(b[1], "@modelcontextprotocol/inspector") {
				session = b
			}
		}
		if session == nil || !strings.Contains(page, "```sh\ngo run . -addr 127.0.0.1:8090 -rate 0 -mcp-key sk_test_sandbox_all\n```") {
			t.Fatal("no Inspector session on the page, or not its sandbox")
		}
		e := newEnv(t, envOptions{rate: -1, quiet: true, mcpKey: "sk_test_sandbox_all", wall: true})
		ts := httptest.NewServer(e.h)
		defer ts.Close()
		bin := t.TempDir()
		inspector := `#!/usr/bin/env bash
# The MCP Inspector's command line, as far as the session uses it: one method a run, its
# result printed as JSON.
set -euo pipefail
[ "$1" = --yes ] && [ "$2" = @modelcontextprotocol/inspector ] && [ "$3" = --cli ] || { echo "npx: $*?" >&2; exit 1; }
url=$4; shift 4
method= tool= args='{}'
while [ $# -gt 0 ]; do
  case $1 in
    --method) method=$2; shift 2 ;;
    --tool-name) tool=$2; shift 2 ;;
    --tool-arg) args=$(jq -c --arg k "${2%%=*}" --arg v "${2#*=}" '. + {($k): $v}' <<<"$args"); shift 2 ;;
    *) echo "inspector: $1?" >&2; exit 1 ;;
  esac
done
params='{}'
[ "$method" = tools/call ] && params=$(jq -nc --arg n "$tool" --argjson a "$args" '{name: $n, arguments: $a}')
curl -sf "$url" -H 'Content-Type: application/json' -H 'MCP-Protocol-Version: 2025-11-25' \
  -d "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"$method\",\"params\":$params}" | jq '.result'
`
		if err := os.WriteFile(filepath.Join(bin, "npx"), []byte(inspector), 0o755); err != nil {
			t.Fatal(err)
		}
		sh := exec.Command("bash", "-euo", "pipefail", "-c", strings.ReplaceAll(session[1], "http://127.0.0.1:8090", ts.URL))
		sh.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
		out, err := sh.CombinedOutput()
		ids := regexp.MustCompile(`req_[0-9a-z]{20}`)
		if got, want := ids.ReplaceAllString(string(out), "req_ID"), ids.ReplaceAllString(session[2], "req_ID")+"\n"; err != nil || got != want {
			t.Errorf("the session: %v\n%s\nthe page shows:\n%s", err, got, want)
		}
	})
}

// FuzzMCPMessage: whatever a client sends the door (a body, a revision, a name), it answers
// with one JSON-RPC answer or the API's problem, never a 500 of its own, and a tool's result
// is the API's answer or the door's problem.
func FuzzMCPMessage(f *testing.F) {
	for _, seed := range []struct{ body, revision, name string }{
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_tracking","arguments":{"shipment_id":"shp_sbx_spring"}}}`, "2025-11-25", ""},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_orders","arguments":{"limit":2,"limit":3,"x":null}}}`, "", ""},
		{`{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"book_shipment","arguments":{"reference":"R","idempotency_key":"k","events":[{}]}}}`, "2025-06-18", ""},
		{`{"jsonrpc":"2.0","id":2,"method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`, "2026-07-28", ""},
		{`{"jsonrpc":"2.0","id":3,"method":"resources/read","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}},"uri":"sandbox:///README.md"}}`, "2026-07-28", "=?base64?c2FuZGJveDovLy9SRUFETUUubWQ=?="},
		{`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":7}}`, "", ""},
		{`[{"jsonrpc":"2.0"}]`, "", ""}, {`{"jsonrpc":"2.0","method":"x"}`, "", ""}, {``, "", ""}, {`{"jsonrpc":"2.0","id":1e400,"method":"ping"}`, "", ""},
	} {
		f.Add(seed.body, seed.revision, seed.name)
	}
	e := newEnv(f, envOptions{rate: -1, quiet: true, step: -1})
	f.Fuzz(func(t *testing.T, body, revision, name string) {
		r := mcpRequest(body)
		if revision != "" && httpguts(revision) {
			r.Header.Set("MCP-Protocol-Version", revision)
			r.Header.Set("Mcp-Method", "tools/call")
		}
		if name != "" && httpguts(name) {
			r.Header.Set("Mcp-Name", name)
		}
		rec := httptest.NewRecorder()
		e.h.ServeHTTP(rec, r)
		switch ct := rec.Header().Get("Content-Type"); {
		case rec.Code == 202:
		case rec.Code == 413 && ct == "application/problem+json":
		case ct != "application/json" || (rec.Code != 200 && rec.Code != 400 && rec.Code != 404):
			t.Fatalf("%q answered %d %s: %s", body, rec.Code, ct, rec.Body)
		default:
			var a rpcAnswer
			if err := json.Unmarshal(rec.Body.Bytes(), &a); err != nil || a.JSONRPC != "2.0" || (a.Result == nil) == (a.Error == nil) {
				t.Fatalf("%q answered %d, not one JSON-RPC answer: %s", body, rec.Code, rec.Body)
			}
			if a.Error != nil && a.Error.Code == -32603 {
				t.Fatalf("%q: an internal error: %s", body, rec.Body)
			}
		}
	})
}

// httpguts reports whether v may be sent as a header field's value (visible ASCII and
// spaces), as a client's transport would send it.
func httpguts(v string) bool {
	return !strings.ContainsFunc(v, func(r rune) bool { return r < 0x20 || r > 0x7e })
}

// BenchmarkMCPGetTracking: a tools/call of get_tracking against a plain GET of the same
// view: over HTTP (a real socket each), and over stdio (the bridge's carry of one line, to
// this process's door). The contract: tools/call at most 3 times the GET over HTTP, and over
// stdio at most the GET.
func BenchmarkMCPGetTracking(b *testing.B) {
	e := benchEnv(b, 0)
	ts := httptest.NewServer(e.h)
	defer ts.Close()
	call := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_tracking","arguments":{"shipment_id":"shp_sbx_spring"}}}`
	client := ts.Client()
	do := func(b *testing.B, r *http.Request) {
		res, err := client.Do(r)
		if err != nil || res.StatusCode != 200 {
			b.Fatal(err, res)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
	}
	b.Run("GET over HTTP", func(b *testing.B) {
		for b.Loop() {
			r, _ := http.NewRequest(http.MethodGet, ts.URL+"/v1/shipments/shp_sbx_spring/tracking", nil)
			r.Header.Set("Authorization", "Bearer sk_test_sandbox_all")
			do(b, r)
		}
	})
	b.Run("tools/call over HTTP", func(b *testing.B) {
		for b.Loop() {
			r, _ := http.NewRequest(http.MethodPost, ts.URL+"/mcp", strings.NewReader(call))
			r.Header.Set("Authorization", "Bearer sk_test_sandbox_all")
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("MCP-Protocol-Version", "2025-11-25")
			do(b, r)
		}
	})
	b.Run("tools/call over stdio", func(b *testing.B) {
		var out bytes.Buffer
		bridge := newMCPBridge(ts.URL+"/v1", e.srv, true, "sk_test_sandbox_all", &out, func(string) {})
		line := stdinLine{text: []byte(call)}
		for b.Loop() {
			out.Reset()
			bridge.carry(context.Background(), line)
			if !bytes.Contains(out.Bytes(), []byte(`HTTP 200`)) {
				b.Fatal(out.String())
			}
		}
	})
}

// ===== main.go, check: the conformance kit against servers right, broken and hostile =====

// kitReport is a report of the kit as its JSON writes it: the tests' own copy, decoded
// strictly.
type kitReport struct {
	BaseURL  string   `json:"base_url"`
	Profile  string   `json:"profile"`
	Mode     string   `json:"mode"`
	World    string   `json:"world"`
	Warnings []string `json:"warnings"`
	Rules    []struct {
		ID       string  `json:"id"`
		Level    string  `json:"level"`
		Title    string  `json:"title"`
		Spec     string  `json:"spec"`
		Result   string  `json:"result"`
		Reason   *string `json:"reason"`
		Evidence []struct {
			Expected  string `json:"expected"`
			Seen      string `json:"seen"`
			Status    int    `json:"status"`
			Curl      string `json:"curl"`
			RequestID string `json:"request_id"`
		} `json:"evidence"`
	} `json:"rules"`
	Summary struct {
		Total, Passed, Failed, Skipped, Expected, Stale, Evaluated, Requests, Retried int
		FailedMust                                                                    int `json:"failed_must"`
	} `json:"summary"`
}

// results are the ids of the rules of this result, in the report's order.
func (r kitReport) results(result string) []string {
	var ids []string
	for _, rule := range r.Rules {
		if rule.Result == result {
			ids = append(ids, rule.ID)
		}
	}
	return ids
}

// reason is the reason the report gives rule id, "" for none.
func (r kitReport) reason(id string) string {
	for _, rule := range r.Rules {
		if rule.ID == id && rule.Reason != nil {
			return *rule.Reason
		}
	}
	return ""
}

// kitRun runs the kit with args as go run . check runs it, env its environment, and returns
// its exit status, its report (decoded when it wrote JSON), and what it wrote.
func kitRun(t *testing.T, ctx context.Context, env map[string]string, args ...string) (int, kitReport, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	status := runCheck(ctx, args, func(name string) string { return env[name] }, &stdout, &stderr, startSelfCheck)
	var rep kitReport
	if slices.Contains(args, "json") && status < 2 {
		mustDecodeExact(t, stdout.Bytes(), &rep)
	}
	return status, rep, stdout.String(), stderr.String()
}

// brokenServer is the real handler chain with one thing broken: the request rewritten
// before the server reads it, the answer after it writes it, or both.
type brokenServer struct {
	request func(r *http.Request)
	answer  func(r *http.Request, a *brokenAnswer)
}

// brokenAnswer is an answer the broken server may rewrite before it is sent.
type brokenAnswer struct {
	status int
	header http.Header
	body   []byte
}

func (b brokenServer) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if b.request != nil {
			b.request(r)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		a := &brokenAnswer{status: rec.Code, header: rec.Header(), body: rec.Body.Bytes()}
		if b.answer != nil {
			b.answer(r, a)
		}
		for name, values := range a.header {
			w.Header()[name] = values
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(a.body)))
		w.WriteHeader(a.status)
		w.Write(a.body)
	})
}

// kitServer serves e's handler chain, broken as b says, and returns its base URL.
func kitServer(t *testing.T, e *env, b brokenServer) string {
	t.Helper()
	ts := httptest.NewServer(b.wrap(e.h))
	t.Cleanup(ts.Close)
	return ts.URL + "/v1"
}

// rewriteBody replaces the request's body with what edit makes of it.
func rewriteBody(r *http.Request, edit func(string) string) {
	b, _ := io.ReadAll(r.Body)
	nb := edit(string(b))
	r.Body, r.ContentLength = io.NopCloser(strings.NewReader(nb)), int64(len(nb))
}

// rewriteJSON replaces an answer's JSON body with what edit makes of it.
func rewriteJSON(a *brokenAnswer, edit func(v any) any) {
	var v any
	if json.Unmarshal(a.body, &v) != nil {
		return
	}
	a.body, _ = json.Marshal(edit(v))
}

// rewriteQuery replaces the request's query with what edit makes of it.
func rewriteQuery(r *http.Request, edit func(q url.Values)) {
	q := r.URL.Query()
	edit(q)
	r.URL.RawQuery = q.Encode()
	r.RequestURI = r.URL.RequestURI()
}

// rewritePath sends the request to another path.
func rewritePath(r *http.Request, path string) {
	r.URL.Path, r.URL.RawPath = path, ""
	r.RequestURI = r.URL.RequestURI()
}

// isOrders reports whether r asks for a page of orders.
func isOrders(r *http.Request) bool { return r.Method == http.MethodGet && r.URL.Path == "/v1/orders" }

// isOrder reports whether r asks for one order.
func isOrder(r *http.Request) bool {
	return r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/orders/")
}

// isView reports whether r asks for a tracking view.
func isView(r *http.Request) bool {
	return r.Method == http.MethodGet && (strings.HasPrefix(r.URL.Path, "/v1/tracking/") || strings.HasSuffix(r.URL.Path, "/tracking"))
}

// isMaking reports whether r asks for a sandbox.
func isMaking(r *http.Request) bool {
	return r.Method == http.MethodPost && r.URL.Path == "/v1/test_helpers/sandboxes"
}

// eachView rewrites the events of every 200 tracking view.
func eachView(edit func(view map[string]any, events []any) []any) func(r *http.Request, a *brokenAnswer) {
	return func(r *http.Request, a *brokenAnswer) {
		if isView(r) && a.status == 200 {
			rewriteJSON(a, func(v any) any {
				view := v.(map[string]any)
				view["events"] = edit(view, view["events"].([]any))
				return view
			})
		}
	}
}

// madeKeys are the keys of the sandboxes a broken server made, in the order its 201s gave
// them: a break that lets one key through as another reads them.
type madeKeys struct {
	mu   sync.Mutex
	keys []string
}

func (m *madeKeys) note(r *http.Request, a *brokenAnswer) {
	if isMaking(r) && a.status == 201 {
		var made struct{ Keys []struct{ Key string } }
		json.Unmarshal(a.body, &made)
		m.mu.Lock()
		for _, k := range made.Keys {
			m.keys = append(m.keys, k.Key)
		}
		m.mu.Unlock()
	}
}

// at is the key the kit's sandbox gave at i (0: the main key, 3: the expired one, 4: the
// revoked one), or "".
func (m *madeKeys) at(i int) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if i < len(m.keys) {
		return m.keys[i]
	}
	return ""
}

// letThrough is a break that serves requests with the key of the kit's main sandbox when
// they carry the key who names (an unknown key when who is -1), on the tracking operations
// only.
func letThrough(who int) func(e *env) brokenServer {
	return func(e *env) brokenServer {
		made := &madeKeys{}
		return brokenServer{answer: made.note, request: func(r *http.Request) {
			sent := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
			if isView(r) && sent != "" && (who < 0 && sent == unknownKey || who >= 0 && sent == made.at(who)) {
				r.Header.Set("Authorization", "Bearer "+made.at(0))
			}
		}}
	}
}

// problemAnswer makes a an answer of the problem status with code.
func problemAnswer(a *brokenAnswer, status int, code string) {
	a.status = status
	a.header = http.Header{"Content-Type": {"application/problem+json"}, "Request-Id": a.header["Request-Id"], "Cache-Control": {"no-store"}}
	a.body = fmt.Appendf(nil, `{"type":"about:blank","title":%q,"status":%d,"detail":"broken","code":%q,"request_id":"req_broken"}`, http.StatusText(status), status, code)
}

// kitBreak is a server broken in one way, and the rules of the catalogue that catch it (its
// rule, and the rules that depend on what it breaks).
type kitBreak struct {
	name   string
	broken func(e *env) brokenServer
	caught []string
	world  string // "" the kit's own; "discovered" (no sandbox made; the key of acct_other, whose order is linked)
	full   bool   // -mode full, against a sandbox whose limit is 40 a second
	rate   int    // with full: the sandbox's -rate (0 here: 40, which a kit under -race on a loaded machine still outruns: 100 once was not)
}

// kitBreaks are the broken servers: at least one for every rule of the catalogue
// (TestEveryRuleIsCaughtFailing), the twenty that once passed among them.
var kitBreaks = []kitBreak{
	{name: "nothing broken", broken: func(*env) brokenServer { return brokenServer{} }},
	{name: "nothing broken, discovered", broken: func(*env) brokenServer { return brokenServer{} }, world: "discovered"},
	{name: "nothing broken, full", broken: func(*env) brokenServer { return brokenServer{} }, full: true},
	{name: "a request without a key let through", caught: []string{"auth.missing_key"}, broken: func(*env) brokenServer {
		return brokenServer{request: func(r *http.Request) {
			if r.Header.Get("Authorization") == "" {
				r.Header.Set("Authorization", "Bearer sk_test_sandbox_all")
			}
		}}
	}},
	{name: "an unknown key served on the tracking operations", caught: []string{"auth.invalid_key"}, broken: letThrough(-1)},
	{name: "an expired key served on the tracking operations", caught: []string{"auth.expired_key"}, broken: letThrough(3)},
	{name: "a revoked key served on the tracking operations", caught: []string{"auth.revoked_key"}, broken: letThrough(4)},
	{name: "403 answered 404", caught: []string{"auth.scope_orders", "auth.scope_tracking"}, broken: func(*env) brokenServer {
		return brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
			if a.status == 403 {
				problemAnswer(a, 404, "not_found")
			}
		}}
	}},
	{name: "another account's order shown", caught: []string{"auth.other_account"}, broken: func(e *env) brokenServer {
		made := &madeKeys{}
		return brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
			made.note(r, a)
			if isOrder(r) && a.status == 404 && made.at(0) != "" {
				again := httptest.NewRecorder()
				e.h.ServeHTTP(again, newRequest(http.MethodGet, r.URL.Path, made.at(0)))
				if again.Code == 200 {
					a.status, a.header, a.body = 200, again.Header(), again.Body.Bytes()
				}
			}
		}}
	}},
	{name: "UTC written +00:00", caught: []string{"orders.fields", "tracking.utc", "tracking.utc_across_dst"}, broken: func(*env) brokenServer {
		return brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
			a.body = regexp.MustCompile(`(T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?)Z"`).ReplaceAll(a.body, []byte(`$1+00:00"`))
		}}
	}},
	{name: "a renamed member: timestamp written time", caught: []string{"tracking.dedup", "tracking.events", "tracking.exact_fields", "tracking.no_offset", "tracking.utc", "tracking.utc_across_dst", "tracking.view_fields"}, broken: func(*env) brokenServer {
		return brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
			if isView(r) {
				a.body = bytes.ReplaceAll(a.body, []byte(`"timestamp":`), []byte(`"time":`))
			}
		}}
	}},
	{name: "an event shown twice", caught: []string{"tracking.dedup", "tracking.events"}, broken: func(*env) brokenServer {
		return brokenServer{answer: eachView(func(_ map[string]any, events []any) []any {
			if len(events) == 0 {
				return events
			}
			return append([]any{events[0]}, events...)
		})}
	}},
	{name: "a duplicate kept", caught: []string{"tracking.dedup", "tracking.events"}, broken: func(*env) brokenServer {
		return brokenServer{answer: eachView(func(view map[string]any, events []any) []any {
			if view["shipment_id"] != "shp_ck_dup" {
				return events
			}
			dup := map[string]any{"status": "in_transit", "description": "Departed facility", "timestamp": "2025-04-01T10:00:00Z", "location": "York, GB"}
			return append([]any{events[0], dup}, events[1:]...)
		})}
	}},
	{name: "an event the kit never sent shown", caught: []string{"tracking.events"}, broken: func(*env) brokenServer {
		return brokenServer{answer: eachView(func(view map[string]any, events []any) []any {
			if view["shipment_id"] != "shp_ck_dst" {
				return events
			}
			return append(events, map[string]any{"status": "delivered", "description": "Signed for", "timestamp": "2025-03-31T08:15:00Z", "location": "Manchester, GB"})
		})}
	}},
	{name: "descriptions cut to 18 characters", caught: []string{"tracking.events"}, broken: func(*env) brokenServer {
		return brokenServer{answer: eachView(func(_ map[string]any, events []any) []any {
			for _, e := range events {
				if d := e.(map[string]any)["description"].(string); len(d) > 18 {
					e.(map[string]any)["description"] = d[:18]
				}
			}
			return events
		})}
	}},
	{name: "events of one instant reversed", caught: []string{"tracking.events_oldest_first"}, broken: func(*env) brokenServer {
		return brokenServer{answer: eachView(func(_ map[string]any, events []any) []any {
			for i := 1; i < len(events); i++ {
				if a, b := events[i-1].(map[string]any), events[i].(map[string]any); a["timestamp"] == b["timestamp"] {
					events[i-1], events[i] = b, a
				}
			}
			return events
		})}
	}},
	{name: "events newest first", caught: []string{"tracking.events_oldest_first", "tracking.status", "tracking.utc_across_dst"}, broken: func(*env) brokenServer {
		return brokenServer{answer: eachView(func(_ map[string]any, events []any) []any { slices.Reverse(events); return events })}
	}},
	{name: "a timestamp without an offset read as UTC", caught: []string{"tracking.events", "tracking.no_offset"}, broken: func(*env) brokenServer {
		return brokenServer{request: func(r *http.Request) {
			if isMaking(r) {
				rewriteBody(r, func(b string) string { return strings.ReplaceAll(b, `"2025-04-02T09:00:00"`, `"2025-04-02T09:00:00Z"`) })
			}
		}}
	}},
	{name: "offsets ignored", caught: []string{"tracking.events", "tracking.utc_across_dst"}, broken: func(*env) brokenServer {
		return brokenServer{request: func(r *http.Request) {
			if isMaking(r) {
				rewriteBody(r, func(b string) string {
					return regexp.MustCompile(`(T[0-9]{2}:[0-9]{2}:[0-9]{2})[+-][0-9]{2}:[0-9]{2}"`).ReplaceAllString(b, `${1}Z"`)
				})
			}
		}}
	}},
	{name: "a view whose status is always in_transit", caught: []string{"tracking.status"}, broken: func(*env) brokenServer {
		return brokenServer{answer: eachView(func(view map[string]any, events []any) []any {
			view["status"] = "in_transit"
			return events
		})}
	}},
	{name: "a reference lower-cased", caught: []string{"tracking.view_fields"}, broken: func(*env) brokenServer {
		return brokenServer{answer: eachView(func(view map[string]any, events []any) []any {
			view["reference"] = strings.ToLower(view["reference"].(string))
			return events
		})}
	}},
	{name: "a view with the member status written twice", caught: []string{"http.unique_members", "tracking.by_number", "tracking.status", "tracking.view_fields"}, broken: func(*env) brokenServer {
		return brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
			if isView(r) && a.status == 200 {
				a.body = bytes.Replace(a.body, []byte(`"status":`), []byte(`"status":"failure","status":`), 1)
			}
		}}
	}},
	{name: "a null location", caught: []string{"tracking.view_fields"}, broken: func(*env) brokenServer {
		return brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
			if isView(r) {
				a.body = bytes.ReplaceAll(a.body, []byte(`"location":""`), []byte(`"location":null`))
			}
		}}
	}},
	{name: "a status outside the vocabulary", caught: []string{"tracking.events", "tracking.status", "tracking.vocabulary"}, broken: func(*env) brokenServer {
		return brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
			if isView(r) {
				a.body = bytes.ReplaceAll(a.body, []byte(`"status":"delivered"`), []byte(`"status":"DELIVERED"`))
			}
		}}
	}},
	{name: "an extra member on views", caught: []string{"tracking.exact_fields"}, broken: func(*env) brokenServer {
		return brokenServer{answer: eachView(func(view map[string]any, events []any) []any {
			view["carrier"] = "royal_mail"
			return events
		})}
	}},
	{name: "tracking ids and numbers matched case-insensitively", caught: []string{"tracking.exact_lookup"}, broken: func(*env) brokenServer {
		return brokenServer{request: func(r *http.Request) {
			switch {
			case strings.HasPrefix(r.URL.Path, "/v1/tracking/"):
				rewritePath(r, "/v1/tracking/"+strings.ToUpper(strings.TrimPrefix(r.URL.Path, "/v1/tracking/")))
			case isView(r):
				rewritePath(r, strings.ToLower(r.URL.Path))
			}
		}}
	}},
	{name: "a parcel number found", caught: []string{"tracking.primary_number_only"}, broken: func(*env) brokenServer {
		return brokenServer{request: func(r *http.Request) {
			if r.URL.Path == "/v1/tracking/CK1000000005" {
				rewritePath(r, "/v1/tracking/CK1000000004")
			}
		}}
	}},
	{name: "an unknown shipment served as a known one", caught: []string{"tracking.unknown"}, broken: func(*env) brokenServer {
		return brokenServer{request: func(r *http.Request) {
			if strings.Contains(r.URL.Path, "nowhere") || strings.Contains(r.URL.Path, "NOWHERE") {
				if isView(r) {
					rewritePath(r, "/v1/shipments/shp_ck_dst/tracking")
				}
			}
		}}
	}},
	{name: "a number two shipments hold answered with one of them", caught: []string{"tracking.ambiguous_number"}, broken: func(*env) brokenServer {
		return brokenServer{request: func(r *http.Request) {
			if r.URL.Path == "/v1/tracking/CK2000000000" {
				rewritePath(r, "/v1/shipments/shp_ck_twin_a/tracking")
			}
		}}
	}},
	{name: "every lookup by number a 404", world: "discovered", caught: []string{"tracking.by_number"}, broken: func(*env) brokenServer {
		return brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
			if strings.HasPrefix(r.URL.Path, "/v1/tracking/") && a.status == 200 {
				problemAnswer(a, 404, "not_found")
			}
		}}
	}},
	{name: "an order linked to a shipment that answers 404", world: "discovered", caught: []string{"orders.linked_shipment"}, broken: func(*env) brokenServer {
		return brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
			if r.URL.Path == "/v1/shipments/shp_other_1/tracking" {
				problemAnswer(a, 404, "not_found")
			}
		}}
	}},
	{name: "a linked order shown unlinked", caught: []string{"orders.fields", "orders.linked_shipment", "orders.retrieve"}, broken: func(*env) brokenServer {
		return brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
			if strings.HasPrefix(r.URL.Path, "/v1/orders") && a.status == 200 {
				a.body = bytes.ReplaceAll(a.body, []byte(`"shipment_id":"shp_ck_linked"`), []byte(`"shipment_id":null`))
			}
		}}
	}},
	{name: "an order retrieved unlike the one listed", caught: []string{"orders.retrieve"}, broken: func(*env) brokenServer {
		return brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
			if isOrder(r) && a.status == 200 {
				a.body = bytes.Replace(a.body, []byte(`"merchant_reference":"CK-ORDER-`), []byte(`"merchant_reference":"CK-ORDER-X`), 1)
			}
		}}
	}},
	{name: "the retrieve of a cancelled order answered 404", caught: []string{"orders.retrieve"}, broken: retrieveAnswered404("cancelled")},
	{name: "the retrieve of an unfulfilled order answered 404", caught: []string{"orders.retrieve"}, broken: retrieveAnswered404("unfulfilled")},
	{name: "cancelled spelt canceled on retrieve", caught: []string{"orders.retrieve", "orders.vocabulary"}, broken: func(*env) brokenServer {
		return brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
			if isOrder(r) {
				a.body = bytes.ReplaceAll(a.body, []byte(`"status":"cancelled"`), []byte(`"status":"canceled"`))
			}
		}}
	}},
	{name: "an unknown order served as a known one", caught: []string{"orders.unknown"}, broken: func(*env) brokenServer {
		return brokenServer{request: func(r *http.Request) {
			if r.URL.Path == "/v1/orders/"+unknownOrder {
				rewritePath(r, "/v1/orders/ord_ck_0001")
			}
		}}
	}},
	{name: "order ids matched case-insensitively", caught: []string{"orders.exact_id"}, broken: func(*env) brokenServer {
		return brokenServer{request: func(r *http.Request) {
			if isOrder(r) {
				rewritePath(r, strings.ToLower(r.URL.Path))
			}
		}}
	}},
	{name: "an extra member on orders", caught: []string{"orders.exact_fields"}, broken: func(*env) brokenServer {
		return brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
			if a.status == 200 && strings.HasPrefix(r.URL.Path, "/v1/orders") {
				a.body = bytes.ReplaceAll(a.body, []byte(`"merchant_reference":`), []byte(`"note":"gift","merchant_reference":`))
			}
		}}
	}},
	{name: "a default page of 25", caught: []string{"orders.default_limit"}, broken: func(*env) brokenServer {
		return brokenServer{request: func(r *http.Request) {
			if q := r.URL.Query(); isOrders(r) && !q.Has("limit") && !q.Has("cursor") {
				rewriteQuery(r, func(q url.Values) { q.Set("limit", "25") })
			}
		}}
	}},
	{name: "no maximum limit: limit=500 gives every order", caught: []string{"orders.limit_range", "orders.max_limit"}, broken: noMaximumLimit},
	{name: "a cursor on the last page", caught: []string{"orders.pagination"}, broken: func(*env) brokenServer {
		return brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
			if isOrders(r) && a.status == 200 {
				rewriteJSON(a, func(v any) any {
					if p := v.(map[string]any)["pagination"].(map[string]any); p["has_more"] == false {
						p["next_cursor"] = "the-end"
					}
					return v
				})
			}
		}}
	}},
	{name: "an order repeated across pages", caught: []string{"orders.cursor_walk"}, broken: repeatAcrossPages},
	{name: "a malformed cursor answered 200", caught: []string{"orders.malformed_cursor"}, broken: func(*env) brokenServer {
		var issued sync.Map // the cursors the server issued
		return brokenServer{
			request: func(r *http.Request) {
				if q := r.URL.Query(); isOrders(r) && q.Has("cursor") {
					if _, ok := issued.Load(q.Get("cursor")); !ok {
						rewriteQuery(r, func(q url.Values) { q.Del("cursor") })
					}
				}
			},
			answer: func(r *http.Request, a *brokenAnswer) {
				var page struct {
					Pagination struct {
						NextCursor *string `json:"next_cursor"`
					}
				}
				if isOrders(r) && json.Unmarshal(a.body, &page) == nil && page.Pagination.NextCursor != nil {
					issued.Store(*page.Pagination.NextCursor, true)
				}
			},
		}
	}},
	{name: "a status filter ignored", caught: []string{"orders.filter_status"}, broken: func(*env) brokenServer {
		return brokenServer{request: func(r *http.Request) {
			if q := r.URL.Query(); isOrders(r) && !q.Has("cursor") && q.Has("status") {
				rewriteQuery(r, func(q url.Values) { q.Del("status") })
			}
		}}
	}},
	{name: "created_from exclusive", caught: []string{"orders.filter_created"}, broken: func(*env) brokenServer {
		return brokenServer{request: func(r *http.Request) {
			if q := r.URL.Query(); isOrders(r) && q.Has("created_from") {
				at, _ := parseTimestamp(q.Get("created_from"))
				rewriteQuery(r, func(q url.Values) { q.Set("created_from", at.Add(time.Nanosecond).Format(time.RFC3339Nano)) })
			}
		}}
	}},
	{name: "a cursor not bound to created_from and created_to", caught: []string{"orders.cursor_filters"}, broken: cursorUnboundToCreated},
	{name: "orders oldest first", caught: []string{"orders.order"}, broken: func(*env) brokenServer {
		return brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
			if isOrders(r) && a.status == 200 {
				rewriteJSON(a, func(v any) any { slices.Reverse(v.(map[string]any)["data"].([]any)); return v })
			}
		}}
	}},
	{name: "a wrong method answered 404", caught: []string{"http.method_not_allowed"}, broken: func(*env) brokenServer {
		return brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
			if a.status == 405 {
				problemAnswer(a, 404, "route_not_found")
			}
		}}
	}},
	{name: "a body past 256 KiB read", caught: []string{"http.body_too_large"}, broken: func(*env) brokenServer {
		return brokenServer{request: func(r *http.Request) {
			if r.ContentLength > maxBodyBytes {
				io.Copy(io.Discard, r.Body)
				r.Body, r.ContentLength = http.NoBody, 0
			}
		}}
	}},
	{name: "errors in plain text", caught: []string{"errors.codes", "errors.problem_json", "orders.limit_range"}, broken: func(*env) brokenServer {
		return brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
			if a.status >= 400 {
				a.header.Set("Content-Type", "text/plain; charset=utf-8")
				a.body = []byte(http.StatusText(a.status) + "\n")
			}
		}}
	}},
	{name: "codes renamed", caught: []string{"errors.codes"}, broken: func(*env) brokenServer {
		return brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
			a.body = bytes.ReplaceAll(a.body, []byte(`"code":"not_found"`), []byte(`"code":"missing"`))
		}}
	}},
	{name: "no Request-Id", caught: []string{"http.request_id"}, broken: func(*env) brokenServer {
		return brokenServer{answer: func(r *http.Request, a *brokenAnswer) { a.header.Del("Request-Id") }}
	}},
	{name: "no Cache-Control", caught: []string{"http.no_store"}, broken: func(*env) brokenServer {
		return brokenServer{answer: func(r *http.Request, a *brokenAnswer) { a.header.Del("Cache-Control") }}
	}},
	{name: "no rate limit", full: true, rate: -1, caught: []string{"limits.rate_limit"}, broken: func(*env) brokenServer { return brokenServer{} }},
	{name: "the RateLimit fields missing", full: true, caught: []string{"limits.rate_limit_headers"}, broken: func(*env) brokenServer {
		return brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
			if a.status != 429 {
				a.header.Del("RateLimit")
				a.header.Del("RateLimit-Policy")
			}
		}}
	}},
	{name: "RateLimit fields only on GET /orders", full: true, caught: []string{"limits.rate_limit_headers"}, broken: func(*env) brokenServer {
		return brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
			if !isOrders(r) {
				a.header.Del("RateLimit")
				a.header.Del("RateLimit-Policy")
			}
		}}
	}},
	{name: "garbage in the RateLimit fields", full: true, caught: []string{"limits.rate_limit_headers"}, broken: func(*env) brokenServer {
		return brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
			if a.header.Get("RateLimit") != "" && isView(r) {
				a.header.Set("RateLimit", "plenty left, honest")
			}
		}}
	}},
}

// retrieveAnswered404 is a break that answers the retrieve of an order of status 404.
func retrieveAnswered404(status string) func(*env) brokenServer {
	return func(*env) brokenServer {
		return brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
			if isOrder(r) && a.status == 200 && bytes.Contains(a.body, []byte(`"status":"`+status+`"`)) {
				problemAnswer(a, 404, "not_found")
			}
		}}
	}
}

// noMaximumLimit is a server with no maximum limit: limit=500 gives every order (the real
// handler's pages of 100, joined).
func noMaximumLimit(e *env) brokenServer {
	return brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
		limit, err := strconv.Atoi(r.URL.Query().Get("limit"))
		if !isOrders(r) || err != nil || limit <= 100 || r.URL.Query().Has("cursor") {
			return
		}
		var all []any
		for target := "/v1/orders?limit=100"; target != ""; {
			rec := httptest.NewRecorder()
			e.h.ServeHTTP(rec, newRequest(http.MethodGet, target, strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")))
			var page struct {
				Data       []any
				Pagination struct {
					NextCursor *string `json:"next_cursor"`
				}
			}
			json.Unmarshal(rec.Body.Bytes(), &page)
			all, target = append(all, page.Data...), ""
			if page.Pagination.NextCursor != nil {
				target = "/v1/orders?limit=100&cursor=" + url.QueryEscape(*page.Pagination.NextCursor)
			}
		}
		a.status, a.header = 200, http.Header{"Content-Type": {"application/json"}, "Request-Id": {"req_x"}, "Cache-Control": {"no-store"}}
		a.body, _ = json.Marshal(map[string]any{"data": all, "pagination": map[string]any{"limit": limit, "next_cursor": nil, "has_more": false}})
	}}
}

// repeatAcrossPages shows the previous page's last order again at the head of the next.
func repeatAcrossPages(*env) brokenServer {
	var lastOfPage sync.Map
	return brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
		if !isOrders(r) || a.status != 200 {
			return
		}
		q := r.URL.Query()
		cursor := q.Get("cursor")
		q.Del("cursor")
		rewriteJSON(a, func(v any) any {
			page := v.(map[string]any)
			data := page["data"].([]any)
			if prev, ok := lastOfPage.Load(q.Encode()); ok && cursor != "" {
				data = append([]any{prev}, data...)
			}
			if len(data) > 0 {
				lastOfPage.Store(q.Encode(), data[len(data)-1])
			}
			page["data"] = data
			return page
		})
	}}
}

// cursorUnboundToCreated is a server whose cursors bind the status but not created_from and
// created_to: a cursor sent with other ones is read with those it was issued with.
func cursorUnboundToCreated(*env) brokenServer {
	var issuedFor sync.Map // cursor -> the created filters of the page that issued it
	return brokenServer{
		request: func(r *http.Request) {
			q := r.URL.Query()
			if f, ok := issuedFor.Load(q.Get("cursor")); ok && isOrders(r) {
				filters := f.([2]string)
				rewriteQuery(r, func(q url.Values) {
					q.Del("created_from")
					q.Del("created_to")
					if filters[0] != "" {
						q.Set("created_from", filters[0])
					}
					if filters[1] != "" {
						q.Set("created_to", filters[1])
					}
				})
			}
		},
		answer: func(r *http.Request, a *brokenAnswer) {
			var page struct {
				Pagination struct {
					NextCursor *string `json:"next_cursor"`
				}
			}
			if q := r.URL.Query(); isOrders(r) && json.Unmarshal(a.body, &page) == nil && page.Pagination.NextCursor != nil {
				issuedFor.Store(*page.Pagination.NextCursor, [2]string{q.Get("created_from"), q.Get("created_to")})
			}
		},
	}
}

// breakRun runs the kit against the server of b, and returns its report.
func breakRun(t *testing.T, b kitBreak) (int, kitReport, string) {
	rate := -1
	if b.full {
		rate = cmp.Or(b.rate, 40)
	}
	e := newEnv(t, envOptions{rate: rate, wall: b.full, quiet: true})
	broken := b.broken(e)
	args := []string{"-key", "sk_test_sandbox_all", "-format", "json"}
	if b.world == "discovered" { // no sandbox made: the key of acct_other, whose order is linked to a shipment
		inner := broken.request
		broken.request = func(r *http.Request) {
			if isMaking(r) {
				rewritePath(r, "/v1/nowhere")
			}
			if inner != nil {
				inner(r)
			}
		}
		args = []string{"-key", "sk_test_other_all", "-alt-key", "sk_test_sandbox_all", "-format", "json"}
	}
	if b.full {
		args = append(args, "-mode", "full")
	}
	status, rep, out, errs := kitRun(t, t.Context(), nil, append([]string{"-base-url", kitServer(t, e, broken)}, args...)...)
	if want := cmp.Or(b.world, "own"); rep.World != want {
		t.Fatalf("world %s, want %s\n%s%s", rep.World, want, out, errs)
	}
	if n := e.srv.registry.count(e.srv.now()); n != 0 {
		t.Errorf("%d of the kit's sandboxes left", n)
	}
	return status, rep, out
}

// TestConformanceCatchesBrokenServers: the kit against the sandbox, then against the
// sandbox broken in one way at a time: each break is caught by its rule, and only by the
// rules that depend on it, and the run fails (exit 1) exactly when a MUST rule is among them.
func TestConformanceCatchesBrokenServers(t *testing.T) {
	t.Parallel()
	for _, b := range kitBreaks {
		t.Run(caseName(b.name), func(t *testing.T) {
			t.Parallel()
			status, rep, out := breakRun(t, b)
			failed := rep.results("fail")
			slices.Sort(failed)
			if !slices.Equal(failed, b.caught) {
				t.Errorf("failed %v, want %v\n%s", failed, b.caught, out)
			}
			wantStatus := 0
			for _, r := range rep.Rules {
				if r.Result == "fail" && r.Level == "MUST" {
					wantStatus = 1
				}
			}
			if status != wantStatus {
				t.Errorf("exit status %d, want %d", status, wantStatus)
			}
			if b.world == "" && !b.full && !slices.Equal(rep.results("skip"), []string{"limits.rate_limit", "limits.rate_limit_headers"}) {
				t.Errorf("skipped %v: in safe mode, in its own world, only the two rules that load the server", rep.results("skip"))
			}
		})
	}
}

// TestEveryRuleIsCaughtFailing: the rules the broken servers are caught by are the whole
// catalogue (a rule no broken server fails proves nothing), and the twenty servers that once
// passed every rule, and the six kinds of break the kit must see, are among the breaks.
func TestEveryRuleIsCaughtFailing(t *testing.T) {
	t.Parallel()
	caught := map[string]bool{}
	names := map[string]bool{}
	for _, b := range kitBreaks {
		names[b.name] = true
		for _, id := range b.caught {
			caught[id] = true
		}
	}
	var want []string
	for _, r := range kitRules {
		want = append(want, r.id)
	}
	if got := slices.Sorted(maps.Keys(caught)); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Errorf("the breaks catch %v\nthe catalogue is %v", got, want)
	}
	for _, name := range []string{
		"an unknown key served on the tracking operations", "an expired key served on the tracking operations", "a revoked key served on the tracking operations",
		"tracking ids and numbers matched case-insensitively", "order ids matched case-insensitively", "every lookup by number a 404", "events of one instant reversed",
		"an event the kit never sent shown", "descriptions cut to 18 characters", "a view whose status is always in_transit", "a reference lower-cased",
		"a view with the member status written twice", "the retrieve of a cancelled order answered 404", "the retrieve of an unfulfilled order answered 404",
		"cancelled spelt canceled on retrieve", "a cursor not bound to created_from and created_to", "an order linked to a shipment that answers 404",
		"RateLimit fields only on GET /orders", "garbage in the RateLimit fields", "no maximum limit: limit=500 gives every order",
		// the kinds of break the kit must see
		"a renamed member: timestamp written time", "an order retrieved unlike the one listed", "a status outside the vocabulary", "the RateLimit fields missing",
	} {
		if !names[name] {
			t.Errorf("no break %q", name)
		}
	}
}

// TestConformanceSelfCheck: go run . check without -base-url starts this sandbox in its own
// process, makes its world, judges every rule in full mode, passes every one, and deletes
// its sandboxes, within 300 requests besides the burst; the text report's first and last
// lines say so.
func TestConformanceSelfCheck(t *testing.T) {
	t.Parallel()
	status, rep, out, errs := kitRun(t, t.Context(), nil, "-format", "json")
	if status != 0 || rep.Summary.Passed != len(kitRules) || rep.Mode != "full" || rep.World != "own" || rep.Profile != "sandbox" || len(rep.Warnings) != 0 {
		t.Fatalf("the self-check: status %d, %+v, stderr %s\n%s", status, rep.Summary, errs, out)
	}
	for _, r := range rep.Rules {
		if r.Result != "pass" || r.Reason != nil || len(r.Evidence) != 0 || r.Spec == "" || r.Title == "" {
			t.Errorf("%s: %+v", r.ID, r)
		}
	}
	if rep.Summary.Requests > 300+maxBurst { // the burst sends until a 429: more on a machine too busy to outrun the refill
		t.Errorf("the self-check sent %d requests, want at most 300 besides the burst's %d", rep.Summary.Requests, maxBurst)
	}
	if _, safe, _, _ := kitRun(t, t.Context(), nil, "-format", "json", "-mode", "safe"); safe.Summary.Requests > 300 || safe.Summary.Evaluated != len(kitRules)-2 {
		t.Errorf("the catalogue but the burst: %+v, want at most 300 requests", safe.Summary)
	}
	status, _, text, _ := kitRun(t, t.Context(), nil, "-rules", "orders.*")
	lines := strings.Split(strings.TrimSpace(text), "\n")
	n := len(rulesNamed("orders.*"))
	if status != 0 || !regexp.MustCompile(`^Conformance of http://127\.0\.0\.1:[0-9]+/v1 \(profile sandbox, mode full, world own\)$`).MatchString(lines[0]) ||
		lines[len(lines)-1] != fmt.Sprintf("%d rules: %d passed, 0 failed (0 MUST), 0 skipped, 0 expected, 0 stale; evaluated %d of %d", n, n, n, n) || !strings.HasPrefix(lines[1], "PASS  orders.fields  ") {
		t.Errorf("the text report of orders.*:\n%s", text)
	}
}

// TestTheCatalogueIsOneTable: docs/conformance.md lists the catalogue's rules, in its order,
// each with its level (its level with -profile domain_adapter, when another) and title; each
// rule has a well-formed id, a judge and the words it rests on.
func TestTheCatalogueIsOneTable(t *testing.T) {
	t.Parallel()
	page, err := os.ReadFile("docs/conformance.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := regexp.MustCompile("(?m)^\\| `([a-z_]+\\.[a-z_]+)` \\| ([A-Z]+(?: \\(SHOULD with domain_adapter\\))?) \\| (.*) \\|$").FindAllStringSubmatch(string(page), -1)
	var want, got []string
	for _, r := range kitRules {
		level := string(r.level)
		if r.adapter != "" {
			level += " (" + string(r.adapter) + " with domain_adapter)"
		}
		want = append(want, r.id+" | "+level+" | "+r.title)
	}
	for _, row := range rows {
		got = append(got, row[1]+" | "+row[2]+" | "+row[3])
	}
	if !slices.Equal(got, want) {
		t.Errorf("docs/conformance.md's rules:\n%s\nthe catalogue:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	ids := map[string]bool{}
	for _, r := range kitRules {
		if ids[r.id] || !regexp.MustCompile(`^[a-z]+\.[a-z_]+$`).MatchString(r.id) || r.judge == nil || r.spec == "" {
			t.Errorf("rule %q: a duplicate, a malformed id, or no judge or spec", r.id)
		}
		ids[r.id] = true
	}
}

// TestConformanceSelectsRulesAndExpectations: -rules judges and reports the rules it names
// (the rules that judge every answer judge those rules' answers, or, named alone, every
// rule's); -expect makes a failure it names expected (exit 0); a pass it names is stale,
// counted, and fails the run, its reason naming the entry to remove; an id's entry wins
// over a prefix, and the longer prefix over the shorter; -strict fails a SHOULD rule's
// failure.
func TestConformanceSelectsRulesAndExpectations(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, quiet: true})
	base := kitServer(t, e, brokenServer{
		request: func(r *http.Request) { // a default page of 25
			if q := r.URL.Query(); isOrders(r) && !q.Has("limit") && !q.Has("cursor") {
				rewriteQuery(r, func(q url.Values) { q.Set("limit", "25") })
			}
		},
		answer: func(r *http.Request, a *brokenAnswer) { // and no Cache-Control on the tracking views
			if isView(r) {
				a.header.Del("Cache-Control")
			}
		},
	})
	kit := func(t *testing.T, args ...string) (int, kitReport, string) {
		status, rep, out, errs := kitRun(t, t.Context(), nil, append([]string{"-base-url", base, "-key", "sk_test_sandbox_all", "-format", "json"}, args...)...)
		return status, rep, out + errs
	}
	t.Run("rules", func(t *testing.T) {
		status, rep, out := kit(t, "-rules", "orders.default_limit,http.*")
		if status != 1 || strings.Join(rep.results("fail"), " ") != "orders.default_limit" || rep.Summary.Total != 6 {
			t.Errorf("-rules orders.default_limit,http.*: %d %v\n%s", status, rep.results("fail"), out)
		}
		status, rep, out = kit(t, "-rules", "http.no_store") // alone: it judges every rule's answers
		if status != 0 || strings.Join(rep.results("fail"), " ") != "http.no_store" || rep.Summary.Total != 1 {
			t.Errorf("-rules http.no_store: %d %v\n%s", status, rep.results("fail"), out)
		}
		if status, _, _ = kit(t, "-rules", "http.no_store", "-strict"); status != 1 {
			t.Errorf("-strict with a SHOULD rule failed: exit status %d", status)
		}
	})
	t.Run("expectations", func(t *testing.T) {
		expect := writeTemp(t, `{"orders.default_limit":"live pages 25","orders.max_limit":"thought to differ","orders.*":"the orders","orders.d*":"the d orders"}`)
		status, rep, out := kit(t, "-rules", "orders.default_limit,orders.max_limit,orders.unknown,orders.order", "-expect", expect)
		got := map[string]string{}
		for _, r := range rep.Rules {
			got[r.ID] = r.Result + ": " + *r.Reason
		}
		want := map[string]string{
			"orders.default_limit": "expected: live pages 25", // its id over the prefixes
			"orders.max_limit":     `pass: expected to fail (thought to differ), but passes: the expectation is stale; remove "orders.max_limit" from ` + expect,
			"orders.unknown":       `pass: expected to fail (the orders), but passes: the expectation is stale; remove "orders.*" from ` + expect,
			"orders.order":         `pass: expected to fail (the orders), but passes: the expectation is stale; remove "orders.*" from ` + expect,
		}
		if status != 1 || !maps.Equal(got, want) || rep.Summary.Expected != 1 || rep.Summary.Stale != 3 || rep.Summary.Passed != 3 {
			t.Errorf("-expect: %d %v %+v\n%s", status, got, rep.Summary, out)
		}
		longer := writeTemp(t, `{"orders.*":"the orders","orders.default_*":"the default page"}`)
		if _, rep, _ := kit(t, "-rules", "orders.default_limit", "-expect", longer); rep.reason("orders.default_limit") != "the default page" {
			t.Errorf("of two prefixes, the reason of %q, not the longer's", rep.reason("orders.default_limit"))
		}
		if status, rep, _ := kit(t, "-rules", "orders.default_limit", "-expect", writeTemp(t, `{"orders.default_limit":"live pages 25"}`)); status != 0 || rep.Summary.Expected != 1 {
			t.Errorf("an expected failure alone: %d %+v", status, rep.Summary)
		}
	})
	t.Run("junit", func(t *testing.T) {
		var junit bytes.Buffer
		expect := writeTemp(t, `{"orders.default_limit":"live pages 25"}`)
		runCheck(t.Context(), []string{"-base-url", base, "-key", "sk_test_sandbox_all", "-format", "junit", "-rules", "orders.default_limit,tracking.no_offset,http.no_store", "-expect", expect}, func(string) string { return "" }, &junit, io.Discard, startSelfCheck)
		suite := junitSuite(t, junit.Bytes())
		if len(suite.Cases) != 3 {
			t.Fatalf("junit: %d cases\n%s", len(suite.Cases), junit.String())
		}
		if c := suite.Cases[0]; c.Class != "tracking" || c.Name != "tracking.no_offset" || c.Failure != nil || c.Skipped != nil { // the catalogue's order
			t.Errorf("a pass in JUnit: %+v", c)
		}
		if c := suite.Cases[1]; c.Skipped == nil || c.Skipped.Message != "expected failure: live pages 25" || !strings.Contains(c.Skipped.Text, "expected: limit 20 when none is sent") {
			t.Errorf("an expected failure in JUnit, its evidence with it: %+v", c)
		}
		c := suite.Cases[2]
		if c.Failure == nil || strings.Count(c.Failure.Text, "expected: ") != maxCited || !strings.Contains(c.Failure.Text, "answers that failed this rule; the first 5 are cited]") {
			t.Fatalf("a failure of many answers, cited up to %d and counted: %+v", maxCited, c)
		}
		if strings.Contains(c.Failure.Text, "request id: \n") {
			t.Error("an empty request id: line")
		}
	})
}

// junitCase is a test case of the kit's JUnit report.
type junitCase struct {
	Class   string `xml:"classname,attr"`
	Name    string `xml:"name,attr"`
	Failure *struct {
		Message string `xml:"message,attr"`
		Text    string `xml:",chardata"`
	} `xml:"failure"`
	Skipped *struct {
		Message string `xml:"message,attr"`
		Text    string `xml:",chardata"`
	} `xml:"skipped"`
}

// junitSuite decodes the kit's JUnit report, which must be well-formed XML 1.0.
func junitSuite(t *testing.T, b []byte) struct {
	Name  string      `xml:"name,attr"`
	Cases []junitCase `xml:"testcase"`
} {
	t.Helper()
	var suite struct {
		Name  string      `xml:"name,attr"`
		Cases []junitCase `xml:"testcase"`
	}
	if err := xml.Unmarshal(b, &suite); err != nil || suite.Name != "conformance" {
		t.Fatalf("junit: %v\n%s", err, b)
	}
	return suite
}

// TestConformanceExitStatuses: a usage error names its flag or variable, never a key's
// value (2); a server the kit cannot judge says why (2): unreachable, a key refused or
// lacking a scope, not the API, a base URL without its /v1.
func TestConformanceExitStatuses(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, quiet: true})
	base := kitServer(t, e, brokenServer{})
	closed := func() string { // an address nothing listens on
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return "http://" + ln.Addr().String() + "/v1"
	}()
	notAPI := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "<html>hello</html>") }))
	t.Cleanup(notAPI.Close)
	for _, tt := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"an unknown flag", nil, []string{"-nope"}, "flag provided but not defined: -nope (see check -h for the flags)"},
		{"a base URL that is none", nil, []string{"-base-url", "/v1", "-key", "sk_test_abcdefgh"}, `invalid value "/v1" for flag -base-url: want an absolute http or https URL`},
		{"a base URL from the environment", map[string]string{"SANDBOX_CHECK_BASE_URL": "ftp://x/v1", "SANDBOX_CHECK_KEY": "sk_test_abcdefgh"}, nil, `invalid value "ftp://x/v1" for SANDBOX_CHECK_BASE_URL (the fallback of -base-url): want an absolute http or https URL`},
		{"no key", nil, []string{"-base-url", base}, "-key: a test key with both scopes is required with -base-url (or SANDBOX_CHECK_KEY)"},
		{"a key not sendable", nil, []string{"-base-url", base, "-key", "two words here"}, "-key: not sendable as a Bearer credential"},
		{"a short key", map[string]string{"SANDBOX_CHECK_ALT_KEY": "k1"}, []string{"-base-url", base, "-key", "sk_test_abcdefgh"}, "SANDBOX_CHECK_ALT_KEY: shorter than 8 characters"},
		{"a profile", nil, []string{"-profile", "live"}, `invalid value "live" for flag -profile: want sandbox or domain_adapter`},
		{"a mode", map[string]string{"SANDBOX_CHECK_MODE": "fast"}, nil, `invalid value "fast" for SANDBOX_CHECK_MODE (the fallback of -mode): want safe or full`},
		{"a format", nil, []string{"-format", "xml"}, `invalid value "xml" for flag -format: want text or json or junit`},
		{"a timeout", nil, []string{"-timeout", "0s"}, `invalid value "0s" for flag -timeout: want a positive Go duration`},
		{"a rule", nil, []string{"-rules", "tracking.nope"}, `"tracking.nope" names no rule`},
		{"a prefix", nil, []string{"-rules", "nope.*"}, `"nope.*" names no rule`},
		{"an expectation of no rule", nil, []string{"-expect", writeTemp(t, `{"auth.nope":"x"}`)}, `"auth.nope" names no rule`},
		{"an expectation file that is none", nil, []string{"-expect", writeTemp(t, `[1]`)}, "want a JSON object of rule id to reason"},
		{"unreachable", nil, []string{"-base-url", closed, "-key", "sk_test_abcdefgh", "-timeout", "2s"}, "the base URL " + closed + " cannot be reached, or does not answer HTTP"},
		{"a refused key", nil, []string{"-base-url", base, "-key", "sk_test_nobody00"}, "answered 401: the key is refused"},
		{"a key without a scope", nil, []string{"-base-url", base, "-key", "sk_test_sandbox_tracking"}, "answered 403: the key lacks a scope"},
		{"not the API", nil, []string{"-base-url", notAPI.URL + "/v1", "-key", "sk_test_abcdefgh"}, "with a body that is not a JSON object: this is not the API"},
		{"a path of no API", nil, []string{"-base-url", strings.TrimSuffix(base, "/v1") + "/elsewhere/v1", "-key", "sk_test_sandbox_all"}, "answered 404: this is not the API"},
		{"a base URL without /v1", nil, []string{"-base-url", strings.TrimSuffix(base, "/v1"), "-key", "sk_test_sandbox_all"}, "answered 404: is /v1 missing from the base URL?"},
	} {
		t.Run(caseName(tt.name), func(t *testing.T) {
			t.Parallel()
			status, _, out, errs := kitRun(t, t.Context(), tt.env, tt.args...)
			if status != 2 || !strings.Contains(errs, tt.want) || out != "" {
				t.Errorf("exit status %d, stderr %q; want 2 and %q", status, errs, tt.want)
			}
			if strings.Contains(errs, "two words here") || strings.Contains(errs, "k1") {
				t.Errorf("a usage error shows the key: %s", errs)
			}
		})
	}
	// A live key: every read 503, which the kit judges, saying first that its passes mean
	// little.
	if status, rep, out, _ := kitRun(t, t.Context(), nil, "-base-url", base, "-key", "sk_live_sandbox_all", "-format", "json"); status != 1 || len(rep.Warnings) != 1 || !strings.Contains(rep.Warnings[0], "503:") {
		t.Errorf("a live key: %d, warnings %v\n%s", status, rep.Warnings, out)
	}
	var usage bytes.Buffer
	if status := runCheck(t.Context(), []string{"-h"}, func(string) string { return "" }, &usage, io.Discard, startSelfCheck); status != 0 || !strings.Contains(usage.String(), "-alt-key") || !strings.Contains(usage.String(), "SANDBOX_CHECK_<NAME>") {
		t.Errorf("check -h: %d\n%s", status, usage.String())
	}
}

// TestConformanceAtAnyBase: a server that serves the API's paths at its root (as a Prism mock
// does) is judged at the base given.
func TestConformanceAtAnyBase(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, quiet: true})
	root := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rewritePath(r, "/v1"+r.URL.Path)
		e.h.ServeHTTP(w, r)
	}))
	t.Cleanup(root.Close)
	status, rep, out, _ := kitRun(t, t.Context(), nil, "-base-url", root.URL+"/", "-key", "sk_test_sandbox_all", "-format", "json")
	if status != 0 || rep.World != "own" || rep.BaseURL != root.URL || len(rep.results("fail")) != 0 {
		t.Errorf("at the root: %d %s %v\n%s", status, rep.BaseURL, rep.results("fail"), out)
	}
}

// hostileRun runs the kit against the sandbox behind a hostile server with args, in every
// report format, and returns each report (decoded: the JSON one strictly, the JUnit one as
// XML 1.0) with what it wrote to standard error; every key the run was given or made, as
// hostile saw them.
type hostileRun struct {
	status    int
	json      kitReport
	text, err string
	junit     []byte
	keys      []string
}

func runHostile(t *testing.T, e *env, b brokenServer, args ...string) []hostileRun {
	t.Helper()
	made := &madeKeys{}
	answer := b.answer
	b.answer = func(r *http.Request, a *brokenAnswer) {
		made.note(r, a)
		if answer != nil {
			answer(r, a)
		}
	}
	base := kitServer(t, e, b)
	var runs []hostileRun
	for _, format := range []string{"text", "json", "junit"} {
		var stdout, stderr bytes.Buffer
		status := runCheck(t.Context(), append([]string{"-base-url", base, "-key", "sk_test_sandbox_all", "-alt-key", "sk_test_other_all", "-format", format}, args...), func(string) string { return "" }, &stdout, &stderr, startSelfCheck)
		run := hostileRun{status: status, text: stdout.String(), err: stderr.String()}
		switch format {
		case "json":
			if status < 2 {
				mustDecodeExact(t, stdout.Bytes(), &run.json)
			}
		case "junit":
			run.junit = stdout.Bytes()
			if status < 2 {
				junitSuite(t, run.junit)
			}
		}
		runs = append(runs, run)
	}
	made.mu.Lock()
	defer made.mu.Unlock()
	for i := range runs {
		runs[i].keys = append([]string{"sk_test_sandbox_all", "sk_test_other_all"}, made.keys...)
	}
	return runs
}

// holdsKey reports whether s holds a key, or a part of one of 8 characters or more.
func holdsKey(s string, keys []string) string {
	for _, key := range keys {
		for i := 0; i+minMaskedKey <= len(key); i++ {
			if part := key[i : i+minMaskedKey]; strings.Contains(s, part) {
				return part
			}
		}
	}
	return ""
}

// TestConformanceNeverShowsAKey: a server that reflects the credential it is sent into
// Request-Id, into a body whose 512-byte cut splits it, and into a problem: no report, in
// any format, and no message holds a key or any part of one of 8 characters or more, the
// keys given or the ones its sandboxes made; the curl of the evidence names each by its
// role. A sandbox that answers with a key too short to mask is refused, saying so.
func TestConformanceNeverShowsAKey(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		broken brokenServer
		shows  string // what the text report shows of a reflected key, masked
	}{
		{"reflected into Request-Id", brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
			if auth := r.Header.Get("Authorization"); auth != "" && !strings.Contains(auth, unknownKey) { // the unknown key is no secret
				a.header.Set("Request-Id", "req_"+auth)
				a.header.Del("Cache-Control") // a failure, whose evidence cites its Request-Id
			}
		}}, "request id: req_Bearer $"},
		{"reflected into a body, cut at 512 bytes", brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
			if isView(r) { // the evidence's cut leaves 10 characters of the key before it
				a.body = fmt.Appendf(nil, "%s%s", strings.Repeat("x", maxKitField-10-len("Bearer ")), r.Header.Get("Authorization"))
			}
		}}, "xBearer [key]..."},
		{"echoed in plain text", brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
			if a.status >= 400 {
				a.header.Set("Content-Type", "text/plain")
				a.body = []byte("you sent " + r.Header.Get("Authorization"))
			}
		}}, "body: you sent Bearer $"},
	} {
		t.Run(caseName(tt.name), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, envOptions{rate: -1, quiet: true})
			for i, run := range runHostile(t, e, tt.broken) {
				if run.status == 2 {
					t.Fatalf("the kit could not judge: %s", run.err)
				}
				for _, out := range []string{run.text, run.err} {
					if part := holdsKey(out, run.keys); part != "" {
						t.Errorf("a report holds %q, part of a key", part)
					}
				}
				if i == 0 && !strings.Contains(run.text, tt.shows) {
					t.Errorf("the text report does not show %q:\n%s", tt.shows, run.text)
				}
			}
		})
	}
	t.Run("a sandbox whose key is too short to mask", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, envOptions{rate: -1, quiet: true})
		runs := runHostile(t, e, brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
			if isMaking(r) && a.status == 201 {
				a.body = regexp.MustCompile(`"key":"sk_test_[a-z2-7]+"`).ReplaceAll(a.body, []byte(`"key":"k"`))
			}
		}})
		run := runs[1]
		if run.json.World != "discovered" || len(run.json.Warnings) == 0 || !strings.Contains(run.json.Warnings[0], "shorter than 8 characters") {
			t.Errorf("a one-letter key from a sandbox: world %s, warnings %q", run.json.World, run.json.Warnings)
		}
		if strings.Count(run.text, "$") > 100 {
			t.Errorf("the masking garbled the report: %d $ signs", strings.Count(run.text, "$"))
		}
	})
}

// TestConformanceReadsA413SentBeforeTheBody: a server that answers 413 as soon as it has read
// a request's header fields, then resets the connection without reading the body (a busy
// machine's order of events, every time): the kit reads its 413, rather than lose it to the
// body's write the reset cut. Before the kit sent a large body with Expect: 100-continue, the
// write's error hid the answer.
func TestConformanceReadsA413SentBeforeTheBody(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				r := bufio.NewReader(c)
				for { // the header fields, to their blank line
					line, err := r.ReadString('\n')
					if err != nil || line == "\r\n" {
						break
					}
				}
				body := `{"type":"about:blank","title":"Content Too Large","status":413,"detail":"too large","code":"body_too_large","request_id":"req_x"}`
				fmt.Fprintf(c, "HTTP/1.1 413 Request Entity Too Large\r\nContent-Type: application/problem+json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
				c.(*net.TCPConn).SetLinger(0) // a reset, not a graceful close: the body's write fails at once
				c.Close()
			}(conn)
		}
	}()
	k := newKit(context.Background(), checkConfig{baseURL: "http://" + ln.Addr().String() + "/v1", timeout: 10 * time.Second, keys: map[kitRole]string{roleMain: "sk_test_sandbox_all"}}, time.Time{})
	for i := range 20 {
		ex := k.sendOnce(kitRequest{method: http.MethodGet, target: "/orders", role: roleMain, body: bytes.Repeat([]byte("x"), 256<<10+1)})
		if ex.err != nil || ex.status != http.StatusRequestEntityTooLarge {
			t.Fatalf("try %d: %d %v", i, ex.status, ex.err)
		}
	}
}

// TestConformanceReportsWhatAServerSendsSafely: escapes and newlines in bodies, ids and
// header fields forge no line of the text report (no PASS line, no runnable curl line, no
// terminal escape), the JUnit report is well-formed XML 1.0 whatever bytes come, and header
// fields past 64 KiB, or a Request-Id of 1 MiB, are bounded in the evidence and fail the
// rule that read them.
func TestConformanceReportsWhatAServerSendsSafely(t *testing.T) {
	t.Parallel()
	forged := "\x1b[2J\x1b[31mPASS\x1b[0m\nPASS  auth.missing_key  forged\ncurl -s http://evil.example/steal\n\x00\x01\x0b\ufffe"
	e := newEnv(t, envOptions{rate: -1, quiet: true})
	runs := runHostile(t, e, brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
		if isView(r) { // Go's client refuses a header field holding a control character: a body can
			a.status = 500
			a.body = []byte(forged)
		}
	}})
	text := runs[0].text
	for i, line := range strings.Split(text, "\n") {
		switch {
		case strings.ContainsAny(line, "\x1b\x00\x01\x0b"):
			t.Errorf("line %d of the text report holds a control character: %q", i, line)
		case strings.HasPrefix(line, "PASS  auth.missing_key  forged"), strings.HasPrefix(strings.TrimSpace(line), "curl -s http://evil"):
			t.Errorf("line %d of the text report is forged: %q", i, line)
		}
	}
	if !strings.Contains(text, `\u001b[2J`) {
		t.Errorf("the escape is not shown escaped:\n%s", text)
	}
	if runs[0].status != 1 || len(runs[1].json.results("fail")) == 0 {
		t.Fatalf("the hostile run: %d %v", runs[0].status, runs[1].json.results("fail"))
	}
	// Headers past the kit's bound: 256 KiB of them on every view (Go's client alone would take
	// 10 MiB); and a Request-Id of 32 KiB on a 500 to each order read, within the bound, which
	// evidence cuts.
	e = newEnv(t, envOptions{rate: -1, quiet: true})
	runs = runHostile(t, e, brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
		switch {
		case isView(r):
			for i := range 4 {
				a.header.Set(fmt.Sprintf("X-Flood-%d", i), strings.Repeat("f", 64<<10))
			}
		case isOrder(r): // a 500, so that the rules reading an order cite it
			problemAnswer(a, 500, "internal_error")
			a.header.Set("Request-Id", strings.Repeat("r", 32<<10))
		}
	}})
	rep := runs[1].json
	found, longID := false, false
	for _, r := range rep.Rules {
		for _, ev := range r.Evidence {
			found = found || strings.Contains(ev.Seen, "header fields are over 65536 bytes (64 KiB)")
			longID = longID || strings.HasPrefix(ev.RequestID, strings.Repeat("r", 64))
			if len(ev.RequestID) > maxKitField+3 || len(ev.Seen) > 4*maxKitField {
				t.Errorf("%s: an evidence field of %d bytes", r.ID, max(len(ev.RequestID), len(ev.Seen)))
			}
		}
	}
	if !found || !slices.Contains(rep.results("fail"), "tracking.view_fields") {
		t.Errorf("headers past 64 KiB: failed %v, and no evidence says so", rep.results("fail"))
	}
	if !longID {
		t.Errorf("no evidence cites the 32 KiB Request-Id (cut): failed %v", rep.results("fail"))
	}
	for _, run := range runs {
		if len(run.text) > 1<<20 {
			t.Errorf("a report of %d bytes", len(run.text))
		}
	}
}

// TestConformanceKeepsItsPaceWithinBounds: Retry-After as delay-seconds or an HTTP-date is
// what a 429 asks for; a wait longer than -timeout is cut to it; a server that answers 429 to
// every request, or asks for endless waits in RateLimit, ends the run with exit 2 (the kit's
// sandboxes deleted) after 10 refusals in a row, rather than judging every rule against a
// wall; a 429 met once is waited out and counted.
func TestConformanceKeepsItsPaceWithinBounds(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		value string
		want  time.Duration
	}{
		{"3", 3 * time.Second}, {"0", 0}, {now.Add(30 * time.Second).Format(http.TimeFormat), 30 * time.Second},
		{now.Add(-time.Minute).Format(http.TimeFormat), 0}, {"", time.Second}, {"soon", time.Second}, {"-1", time.Second},
	} {
		if got := retryAfter(http.Header{"Retry-After": {tt.value}}, now); got != tt.want {
			t.Errorf("retryAfter(%q) = %v, want %v", tt.value, got, tt.want)
		}
	}
	for _, tt := range []struct {
		name   string
		answer func(r *http.Request, a *brokenAnswer, main string) // main: the key of the kit's main sandbox
		want   string
	}{
		{"429 to everything", func(r *http.Request, a *brokenAnswer, _ string) {
			problemAnswer(a, 429, "rate_limited")
			a.header.Set("Retry-After", now.Add(30*time.Second).Format(http.TimeFormat))
		}, "the server refused the kit's pace"},
		{"an endless wait in RateLimit", func(r *http.Request, a *brokenAnswer, main string) { // the key its DELETE goes with too
			if r.Header.Get("Authorization") == "Bearer "+main {
				a.header.Set("RateLimit", `"default";r=0;t=999999999`)
				a.header.Del("RateLimit-Policy")
			}
		}, "waits in a row longer than -timeout"},
	} {
		t.Run(caseName(tt.name), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, envOptions{rate: -1, quiet: true})
			var requests atomic.Int64
			made := &madeKeys{}
			base := kitServer(t, e, brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
				requests.Add(1)
				made.note(r, a)
				if !isMaking(r) && r.Method != http.MethodDelete {
					tt.answer(r, a, made.at(0))
				}
			}})
			// -timeout bounds each wait the server asks for; 300 ms also leaves a request room on
			// a machine whose every core is busy (at 50 ms the first read could time out there).
			status, _, out, errs := kitRun(t, t.Context(), nil, "-base-url", base, "-key", "sk_test_sandbox_all", "-timeout", "300ms")
			if status != 2 || !strings.Contains(errs, tt.want) || out != "" {
				t.Errorf("exit status %d, stderr %q; want 2 saying %q", status, errs, tt.want)
			}
			if n := requests.Load(); n > 60 {
				t.Errorf("%d requests before the kit stopped: want at most 10 refusals in a row, with their retries", n)
			}
			if n := e.srv.registry.count(e.srv.now()); n != 0 {
				t.Errorf("%d of the kit's sandboxes left", n)
			}
		})
	}
	// One 429 on the first page of orders, then the page: waited out, sent again.
	var once sync.Once
	base := kitServer(t, newEnv(t, envOptions{rate: -1, quiet: true}), brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
		if isOrders(r) && r.URL.RawQuery == "" {
			once.Do(func() {
				problemAnswer(a, 429, "rate_limited")
				a.header.Set("Retry-After", "0")
			})
		}
	}})
	status, rep, out, _ := kitRun(t, t.Context(), nil, "-base-url", base, "-key", "sk_test_sandbox_all", "-rules", "orders.default_limit", "-format", "json")
	if status != 0 || rep.Summary.Retried != 1 || rep.Summary.Passed != 1 {
		t.Errorf("a 429 waited out: %d, %+v\n%s", status, rep.Summary, out)
	}
}

// FuzzKitJudges: whatever a server answers (any status, header fields and bytes, to any of
// the kit's requests from some point on), the kit ends without a panic and writes each of
// its reports. The server is the sandbox in this process, its answers replaced from the
// from-th request on, every every-th (0: only that one), so that the judges meet both the
// sandbox's answers and arbitrary ones.
func FuzzKitJudges(f *testing.F) {
	page := `{"data":[{"id":"o1","merchant_reference":"m","platform":"etsy","status":"fulfilled","shipment_id":null,"created_at":"2026-01-01T00:00:00Z"}],"pagination":{"limit":20,"next_cursor":null,"has_more":false}}`
	view := `{"shipment_id":"s","reference":"r","tracking_number":null,"status":"delivered","events":[{"status":"delivered","description":"d","timestamp":"2026-01-01T00:00:00Z","location":""}]}`
	for _, seed := range []struct {
		from, every uint8
		status      uint16
		header      string
		body        string
	}{
		{0, 0, 200, "Content-Type: application/json", page}, {3, 1, 200, "Content-Type: application/json", page}, {5, 2, 200, "Content-Type: application/json", view},
		{9, 0, 200, "Content-Type: application/json", `{"data":[null,1,{"id":7}],"pagination":null}`}, {12, 3, 404, "", "<html>"},
		{2, 1, 201, "Content-Type: application/json", `{"account":"acct_x","keys":[{"key":"sk_test_0123456789"}]}`},
		{20, 1, 429, "Retry-After: 0\nRateLimit: \"default\";r=0;t=0", ``}, {30, 5, 200, "", `{"events":[{"timestamp":7}],"status":null}`},
		{40, 1, 400, "Content-Type: application/problem+json", `{"type":"about:blank","status":"400","code":7}`}, {1, 1, 200, "", "\xff\xfe"},
	} {
		f.Add(seed.from, seed.every, seed.status, seed.header, []byte(seed.body))
	}
	f.Fuzz(kitFuzzOnce)
}

var kitFuzzEnv = sync.OnceValue(func() *env { return newEnv(&testing.T{}, envOptions{rate: -1, quiet: true, wall: true}) })

func kitFuzzOnce(t *testing.T, from, every uint8, status uint16, header string, body []byte) {
	e := kitFuzzEnv()
	{
		var n atomic.Int64
		rt := bridgeTransport(func(r *http.Request) (*http.Response, error) {
			res, err := e.srv.RoundTrip(r)
			if i := n.Add(1); err != nil || i < int64(from) || i > int64(from) && (every == 0 || (i-int64(from))%int64(every) != 0) {
				return res, err
			}
			h := http.Header{}
			for _, line := range strings.Split(header, "\n") {
				if name, value, ok := strings.Cut(line, ":"); ok && httpguts(name) && httpguts(value) && name != "" {
					h.Add(strings.TrimSpace(name), strings.TrimSpace(value))
				}
			}
			code := 100 + int(status)%500
			return &http.Response{Status: strconv.Itoa(code), StatusCode: code, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: h,
				Body: io.NopCloser(bytes.NewReader(body)), ContentLength: -1, Request: r}, nil
		})
		cfg, err := parseCheckConfig([]string{"-base-url", "http://127.0.0.1:1/v1", "-key", "sk_test_sandbox_all", "-timeout", "20ms"}, func(string) string { return "" }, io.Discard) // each wait a server asks for cut short
		if err != nil {
			t.Fatal(err)
		}
		k := newKit(t.Context(), cfg, time.Time{})
		k.client.Transport = rt
		done := make(chan struct{})
		defer close(done)
		go func() {
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				buf := make([]byte, 1<<20)
				panic("hung:\n" + string(buf[:runtime.Stack(buf, true)]))
			}
		}()
		rep, err := k.run()
		if err != nil {
			return // the kit could not judge, and said so
		}
		for _, format := range []string{"text", "json", "junit"} {
			if err := rep.render(io.Discard, format); err != nil {
				t.Errorf("the %s report: %v", format, err)
			}
		}
	}
}

// TestConformanceEndsARuleAtItsFirstStall: a server that stalls every tracking read costs
// one -timeout a rule, not one a request: each rule that reads a view fails at its first
// request cut by -timeout, saying so, and sends nothing more; and a page of 64 MiB fails
// the rules that read it (the kit reads 1 MiB), with no panic.
func TestConformanceEndsARuleAtItsFirstStall(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, quiet: true})
	var views atomic.Int64
	stalling := brokenServer{request: func(r *http.Request) {
		if isView(r) {
			views.Add(1)
			<-r.Context().Done() // the kit gives up at -timeout
		}
	}}
	status, rep, out, errs := kitRun(t, t.Context(), nil, "-base-url", kitServer(t, e, stalling), "-key", "sk_test_sandbox_all", "-timeout", "300ms", "-format", "json")
	cut := 0
	for _, r := range rep.Rules {
		if r.Result == "fail" && len(r.Evidence) == 1 && strings.Contains(r.Evidence[0].Seen, "the rule ends at this request, and sent nothing more") {
			cut++
		}
	}
	if status != 1 || cut == 0 || views.Load() > int64(cut) {
		t.Errorf("exit %d; %d rules ended at a stall, %d views asked for (want at most one a rule)\n%s%s", status, cut, views.Load(), out, errs)
	}
	page := append(append([]byte(`{"data":[`), bytes.Repeat([]byte(`{"id":"x"},`), 64<<20/11)...), `{"id":"x"}],"pagination":{"limit":100,"next_cursor":null,"has_more":false}}`...) // made once: each answer shares it
	huge := brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
		if isOrders(r) && strings.Contains(r.URL.RawQuery, "limit=100") {
			a.body = page
		}
	}}
	status, rep, out, errs = kitRun(t, t.Context(), nil, "-base-url", kitServer(t, e, huge), "-key", "sk_test_sandbox_all", "-format", "json")
	if status != 1 || !slices.Contains(rep.results("fail"), "orders.max_limit") || !strings.Contains(out, "the most the kit reads") {
		t.Errorf("a page of 64 MiB: exit %d, failed %v\n%.2000s%s", status, rep.results("fail"), out, errs)
	}
}

// TestConformanceSaysWhatItCouldNotDelete: the kit's sandboxes are deleted at once, each
// within its own bound: one whose DELETE stalls, or answers 500, is named (its account, never
// its key) in the report's warnings and on standard error, and the other is deleted; a 201
// over 1 MiB, or one whose key holds a newline, gives no world, is said so, and what it made
// is deleted.
func TestConformanceSaysWhatItCouldNotDelete(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		delete  string                                 // what the main sandbox's DELETE meets: "stall" or "500"
		answer  func(r *http.Request, a *brokenAnswer) // a 201 rewritten
		left    int                                    // sandboxes left
		world   string
		warning string
	}{
		{name: "a DELETE that stalls", delete: "stall", left: 1, world: "own", warning: "its DELETE got no answer within 4s"},
		{name: "a DELETE answered 500", delete: "500", left: 1, world: "own", warning: "its DELETE answered 500, not 204"},
		{name: "a 201 over 1 MiB", answer: func(r *http.Request, a *brokenAnswer) {
			if isMaking(r) && a.status == 201 {
				a.body = append(a.body[:len(a.body)-1], []byte(`,"padding":"`+strings.Repeat("p", 1<<20)+`"}`)...)
			}
		}, world: "discovered", warning: "the answer's body is over 1048576 bytes"},
		{name: "a key with a newline", answer: func(r *http.Request, a *brokenAnswer) {
			if isMaking(r) && a.status == 201 {
				a.body = bytes.Replace(a.body, []byte(`"key":"sk_test_`), []byte(`"key":"sk_test_\n`), 1)
			}
		}, world: "discovered", warning: "its key 1 is refused: not sendable as a Bearer credential"},
	} {
		t.Run(caseName(tt.name), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, envOptions{rate: -1, quiet: true})
			var mu sync.Mutex
			main := "" // the main sandbox's account: its 201 gives more than one key
			isMain := func(r *http.Request) bool {
				mu.Lock()
				defer mu.Unlock()
				return r.Method == http.MethodDelete && main != "" && strings.HasSuffix(r.URL.Path, "/"+main)
			}
			base := kitServer(t, e, brokenServer{
				request: func(r *http.Request) {
					switch {
					case isMain(r) && tt.delete == "stall":
						<-r.Context().Done() // the kit gave up: it deletes nothing
						rewritePath(r, "/v1/failing")
					case isMain(r) && tt.delete == "500":
						rewritePath(r, "/v1/failing")
					}
				},
				answer: func(r *http.Request, a *brokenAnswer) {
					if r.URL.Path == "/v1/failing" {
						problemAnswer(a, 500, "internal_error")
					}
					if isMaking(r) && a.status == 201 && bytes.Count(a.body, []byte(`"key"`)) > 1 {
						var made struct{ Account string }
						json.Unmarshal(a.body, &made)
						mu.Lock()
						main = made.Account
						mu.Unlock()
					}
					if tt.answer != nil {
						tt.answer(r, a)
					}
				},
			})
			status, rep, out, errs := kitRun(t, t.Context(), nil, "-base-url", base, "-key", "sk_test_sandbox_all", "-format", "json")
			if status == 2 || rep.World != tt.world {
				t.Fatalf("exit status %d, world %s: %s\n%s", status, rep.World, errs, out)
			}
			if n := e.srv.registry.count(e.srv.now()); n != tt.left {
				t.Errorf("%d of the kit's sandboxes left, want %d", n, tt.left)
			}
			said := strings.Join(rep.Warnings, "\n")
			if !strings.Contains(said, tt.warning) || tt.left > 0 && !strings.Contains(errs, tt.warning) {
				t.Errorf("warnings %q, stderr %q: want them to say %q", rep.Warnings, errs, tt.warning)
			}
			if tt.left > 0 && (!strings.Contains(said, "sandbox "+main+" was not deleted") || strings.Contains(said+errs, "sk_test_")) {
				t.Errorf("the warning does not name the account, or names a key: %q", said)
			}
		})
	}
}

// TestConformanceReadsAsHTTPAndJSONDo: what HTTP and JSON let a server write in more than one
// way fails nothing: Cache-Control's directives in any case, or split over two field lines;
// a number written 20.0 or 2e1; members in another order.
func TestConformanceReadsAsHTTPAndJSONDo(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, quiet: true})
	base := kitServer(t, e, brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
		if isView(r) {
			a.header["Cache-Control"] = []string{"private", "No-Store"}
		} else {
			a.header.Set("Cache-Control", "No-Store")
		}
		a.body = bytes.ReplaceAll(a.body, []byte(`"limit":20,`), []byte(`"limit":20.0,`))
		a.body = bytes.ReplaceAll(a.body, []byte(`"limit":100,`), []byte(`"limit":1e2,`))
		a.body = bytes.ReplaceAll(a.body, []byte(`"status":404,`), []byte(`"status":404.0,`))
		if isOrder(r) && a.status == 200 { // members in another order
			rewriteJSON(a, func(v any) any { return v })
		}
	}})
	status, rep, out, _ := kitRun(t, t.Context(), nil, "-base-url", base, "-key", "sk_test_sandbox_all", "-format", "json")
	if status != 0 || len(rep.results("fail")) != 0 {
		t.Errorf("harmless differences failed %v\n%s", rep.results("fail"), out)
	}
}

// TestConformanceCurlsReproduce: every curl of a failing report, run as written (bash, the
// keys in their variables), sends the request the kit sent: it gets the status the kit saw.
func TestConformanceCurlsReproduce(t *testing.T) {
	t.Parallel()
	needTools(t, "bash", "curl")
	e := newEnv(t, envOptions{rate: -1, quiet: true})
	made := &madeKeys{}
	base := kitServer(t, e, brokenServer{answer: func(r *http.Request, a *brokenAnswer) {
		made.note(r, a)
		switch {
		case a.status == 405: // every wrong method: 404
			problemAnswer(a, 404, "route_not_found")
		case a.status == 413: // a body past 256 KiB read, and answered 200
			a.status = 200
		case a.status == 403 || a.status == 401: // and every refusal a 418
			problemAnswer(a, 418, "teapot")
		}
	}})
	status, rep, out, _ := kitRun(t, t.Context(), nil, "-base-url", base, "-key", "sk_test_sandbox_all", "-format", "json")
	if status != 1 {
		t.Fatalf("exit status %d\n%s", status, out)
	}
	vars := []string{"KEY=sk_test_sandbox_all"}
	for i, role := range []kitRole{roleMain, roleTracking, roleOrders, roleExpired, roleRevoked, roleBurst} {
		vars = append(vars, string(role)+"="+made.at(i))
	}
	vars = append(vars, "ALT_KEY="+made.at(6))
	ran := 0
	for _, r := range rep.Rules {
		for _, ev := range r.Evidence {
			if ev.Status == 0 || !strings.HasPrefix(ev.Curl, "curl ") {
				continue
			}
			ran++
			cmd := exec.Command("bash", "-c", ev.Curl+" -o /dev/null -w '%{http_code}'")
			cmd.Env = append(os.Environ(), vars...)
			got, err := cmd.Output()
			if err != nil || string(got) != strconv.Itoa(ev.Status) {
				t.Errorf("%s: %s\nanswered %s (%v), the kit saw %d", r.ID, ev.Curl, got, err, ev.Status)
			}
		}
	}
	if ran < 10 {
		t.Errorf("%d curls run: want those of auth.*, http.method_not_allowed and http.body_too_large", ran)
	}
}

// TestConformanceSaysWhenItFallsBack: a server that answers 201 to the kit's sandbox without
// the world it asked for (one key of six) is warned of, what it made is deleted, and the kit
// judges what its keys read.
func TestConformanceSaysWhenItFallsBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, quiet: true})
	base := kitServer(t, e, brokenServer{request: func(r *http.Request) {
		if isMaking(r) {
			rewriteBody(r, func(b string) string { return regexp.MustCompile(`,"keys":\[.*\]`).ReplaceAllString(b, "") })
		}
	}})
	status, rep, out, _ := kitRun(t, t.Context(), nil, "-base-url", base, "-key", "sk_test_sandbox_all", "-format", "json")
	if status != 0 || rep.World != "discovered" || len(rep.Warnings) != 1 || !strings.Contains(rep.Warnings[0], "not with the world it asked for: it holds 1 keys, not the 6 asked for") {
		t.Errorf("a 201 of one key: %d, world %s, warnings %q\n%s", status, rep.World, rep.Warnings, out)
	}
	if n := e.srv.registry.count(e.srv.now()); n != 0 {
		t.Errorf("%d of the kit's sandboxes left", n)
	}
}

// TestConformanceDiscoversWhereNoSandboxIsMade: against a server that makes no sandbox, the
// kit reads what its keys read, judges what that holds, skips each rule without its data,
// saying why, and writes nothing but the one sandbox it asked for: its 405 requests carry no
// body and name ids no server holds. With the keys of acct_other and acct_sandbox, which
// hold one tracking number each, the other account's rule sees acct_other's own shipment,
// and passes.
func TestConformanceDiscoversWhereNoSandboxIsMade(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, quiet: true, seed: 150})
	var mu sync.Mutex
	var writes []string
	base := kitServer(t, e, brokenServer{request: func(r *http.Request) {
		if r.Method != http.MethodGet {
			mu.Lock()
			writes = append(writes, fmt.Sprintf("%s %s %d", r.Method, r.URL.Path, r.ContentLength))
			mu.Unlock()
		}
		if isMaking(r) {
			rewritePath(r, "/v1/nowhere")
		}
	}})
	status, rep, out, _ := kitRun(t, t.Context(), nil, "-base-url", base, "-format", "json", "-key", "sk_test_sandbox_all", "-alt-key", "sk_test_other_all",
		"-tracking-key", "sk_test_sandbox_tracking", "-orders-key", "sk_test_sandbox_orders", "-expired-key", "sk_test_sandbox_expired", "-revoked-key", "sk_test_sandbox_revoked")
	if status != 0 || rep.World != "discovered" || len(rep.results("fail")) != 0 || len(rep.Warnings) != 0 {
		t.Fatalf("status %d, world %s, failed %v, warnings %q\n%s", status, rep.World, rep.results("fail"), rep.Warnings, out)
	}
	for id, want := range map[string]string{
		"tracking.no_offset": "needs the kit's own world", "tracking.events": "needs the kit's own world", "tracking.primary_number_only": "needs the kit's own world",
		"tracking.ambiguous_number": "needs the kit's own world", "tracking.view_fields": "no shipment known", "orders.linked_shipment": "no order read is linked",
		"limits.rate_limit": "run with -mode full",
	} {
		if !strings.Contains(rep.reason(id), want) {
			t.Errorf("%s: reason %q, want it to say %q", id, rep.reason(id), want)
		}
	}
	for _, id := range []string{"orders.cursor_walk", "orders.filter_status", "orders.filter_created", "orders.default_limit", "auth.other_account", "auth.expired_key", "auth.scope_orders", "http.method_not_allowed", "orders.exact_id"} {
		if !slices.Contains(rep.results("pass"), id) {
			t.Errorf("%s not judged on the discovered orders: %v", id, rep.reason(id))
		}
	}
	for _, w := range writes {
		if !strings.HasPrefix(w, "POST /v1/test_helpers/sandboxes ") && !strings.HasSuffix(w, " 0") {
			t.Errorf("the kit wrote %s", w)
		}
		if strings.Contains(w, "ord_sbx") || strings.Contains(w, "ord_seed") || strings.Contains(w, "shp_sbx") {
			t.Errorf("a 405 request named an id the server holds: %s", w)
		}
	}
	// acct_other's view: its one order is linked; the number of its shipment is acct_sandbox's too.
	status, rep, out, _ = kitRun(t, t.Context(), nil, "-base-url", base, "-format", "json", "-key", "sk_test_other_all", "-alt-key", "sk_test_sandbox_all")
	if status != 0 || len(rep.results("fail")) != 0 || !slices.Contains(rep.results("pass"), "auth.other_account") || !slices.Contains(rep.results("pass"), "tracking.by_number") {
		t.Errorf("acct_other discovered: %d, failed %v, passed %v\n%s", status, rep.results("fail"), rep.results("pass"), out)
	}
}

// TestConformanceProfiles: -profile domain_adapter makes the kit's sandboxes of that profile
// and expects the domain adapter's 409 for an ambiguous number; a server whose sandboxes
// take no profile is caught there, and only there. Its rate limit is then a SHOULD.
func TestConformanceProfiles(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, quiet: true})
	status, rep, out, _ := kitRun(t, t.Context(), nil, "-base-url", kitServer(t, e, brokenServer{}), "-key", "sk_test_sandbox_all", "-profile", "domain_adapter", "-format", "json")
	if status != 0 || rep.Profile != "domain_adapter" || len(rep.results("fail")) != 0 {
		t.Fatalf("the domain adapter's profile: %d %v\n%s", status, rep.results("fail"), out)
	}
	for _, r := range rep.Rules {
		if r.ID == "limits.rate_limit" && r.Level != "SHOULD" {
			t.Errorf("limits.rate_limit with -profile domain_adapter is %s", r.Level)
		}
	}
	ignored := kitServer(t, newEnv(t, envOptions{rate: -1, quiet: true}), brokenServer{request: func(r *http.Request) {
		if isMaking(r) {
			rewriteBody(r, func(b string) string { return strings.Replace(b, `,"profile":"domain_adapter"`, "", 1) })
		}
	}})
	status, rep, out, _ = kitRun(t, t.Context(), nil, "-base-url", ignored, "-key", "sk_test_sandbox_all", "-profile", "domain_adapter", "-format", "json")
	if status != 1 || strings.Join(rep.results("fail"), " ") != "tracking.ambiguous_number" {
		t.Errorf("a server that answers 404 where the domain adapter answers 409: %d %v\n%s", status, rep.results("fail"), out)
	}
}

// TestConformanceInterrupted: SIGINT while the kit runs (a real process) deletes its
// sandboxes and exits 130 within 5 s, saying so.
func TestConformanceInterrupted(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, quiet: true})
	stalled := make(chan struct{}, 1)
	base := kitServer(t, e, brokenServer{request: func(r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1/tracking/") { // its sandboxes are made: stall it there
			select {
			case stalled <- struct{}{}:
			default:
			}
			<-r.Context().Done()
		}
	}})
	bin, err := sandboxBinary()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "check", "-base-url", base, "-key", "sk_test_sandbox_all", "-timeout", "1m")
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-stalled:
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		t.Fatal("the kit never reached the stalled request")
	}
	if n := e.srv.registry.count(e.clock.now()); n != 2 {
		t.Fatalf("the kit's sandboxes: %d, want 2", n)
	}
	signalled := time.Now()
	cmd.Process.Signal(os.Interrupt)
	took, status := waitExit(t, cmd, signalled, 5*time.Second)
	if status != 130 || took > 5*time.Second || !strings.Contains(stderr.String(), "interrupted: the kit's sandboxes are deleted") {
		t.Errorf("SIGINT: exit status %d after %v; stderr %q", status, took, stderr.String())
	}
	if n := e.srv.registry.count(e.clock.now()); n != 0 {
		t.Errorf("%d of the kit's sandboxes left after SIGINT", n)
	}
}

// TestConformanceLogsNoUnsolicitedAnswer: a server that sends bytes after its answers, its
// keys among them, on a connection the kit keeps (a real process): Go's transport would log
// them to standard error; the kit writes nothing of them.
func TestConformanceLogsNoUnsolicitedAnswer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, quiet: true})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		e.h.ServeHTTP(rec, r)
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		res := rec.Result()
		res.Write(buf)
		fmt.Fprintf(buf, "HTTP/1.1 200 OK\r\nX-Echo: %s\r\n\r\n", r.Header.Get("Authorization")) // unsolicited
		buf.Flush()
		time.Sleep(50 * time.Millisecond)
	})}
	go srv.Serve(ln)
	defer srv.Close()
	bin, err := sandboxBinary()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "check", "-base-url", "http://"+ln.Addr().String()+"/v1", "-key", "sk_test_sandbox_all", "-rules", "orders.default_limit,auth.*")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Run()
	if strings.Contains(stderr.String(), "Unsolicited") || holdsKey(stderr.String()+stdout.String(), []string{"sk_test_sandbox_all"}) != "" || strings.Contains(stderr.String(), "Bearer sk_") {
		t.Errorf("the kit wrote the server's unsolicited bytes:\n%s", stderr.String())
	}
}

// TestConformanceKeysFromTheEnvironment: each flag falls back to SANDBOX_CHECK_<NAME>, so
// that a key need not be on a command line.
func TestConformanceKeysFromTheEnvironment(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rate: -1, quiet: true})
	env := map[string]string{"SANDBOX_CHECK_BASE_URL": kitServer(t, e, brokenServer{}), "SANDBOX_CHECK_KEY": "sk_test_sandbox_all", "SANDBOX_CHECK_RULES": "auth.*", "SANDBOX_CHECK_FORMAT": "json"}
	status, rep, out, _ := kitRun(t, t.Context(), env, "-format", "json")
	if status != 0 || rep.Summary.Passed != len(rulesNamed("auth.*")) {
		t.Errorf("from the environment: %d %+v\n%s", status, rep.Summary, out)
	}
}

// TestTheKitMasksEscapesAndReadsFields: the masking of keys whole and in parts; what the text
// report escapes; XML 1.0's forbidden characters; the RateLimit fields as the draft writes
// them.
func TestTheKitMasksEscapesAndReadsFields(t *testing.T) {
	t.Parallel()
	s := newSecrets(map[kitRole]string{roleMain: "sk_test_q2w3e4r5t6y7u2i3", roleAlt: "alt_key_abcdefgh"})
	for in, want := range map[string]string{
		"Bearer sk_test_q2w3e4r5t6y7u2i3 done":          "Bearer $KEY done",
		"cut: sk_test_q2w3":                             "cut: [key]",
		"tail 4r5t6y7u2i3 and alt_key_abcdefgh":         "tail [key] and $ALT_KEY",
		"short sk_test (7) stays":                       "short sk_test (7) stays",
		"keys run together sk_test_q2w3e4r5alt_key_abc": "keys run together [key]",
	} {
		if got := s.mask(in); got != want {
			t.Errorf("mask(%q) = %q, want %q", in, got, want)
		}
	}
	if got := printable("a\x1b[2Jb\nc\u202ed\xffe"); got != `a\u001b[2Jb\u000ac\u202ed\ufffde` {
		t.Errorf("printable = %q", got)
	}
	if got := xmlText("a\x00b\x1bc<d>&\ufffe\tz"); got != `a\u0000b\u001bc&lt;d&gt;&amp;\ufffe z` {
		t.Errorf("xmlText = %q", got)
	}
	for _, tt := range []struct {
		lines []string
		ok    bool
	}{
		{[]string{`"default";q=25;w=1`}, true}, {[]string{`default;r=0;t=1`}, true}, {[]string{`"a";q=1`, `"b";q=2`}, true},
		{[]string{"plenty left, honest"}, false}, {[]string{`"default";q=lots`}, false}, {[]string{`"default";=1`}, false},
	} {
		if _, err := parseRateLimitField(tt.lines); (err == nil) != tt.ok {
			t.Errorf("parseRateLimitField(%q): %v, want ok %v", tt.lines, err, tt.ok)
		}
	}
}

// TestCheckDiff: check diff OLD NEW compares two reports of the kit rule by rule: each
// change named (same, regressed, improved, changed, added, removed), the text and JSON forms,
// -all, -out, exit 1 on a regression, 2 for a file that is not a report, saying which and why.
func TestCheckDiff(t *testing.T) {
	t.Parallel()
	profiled := func(profile, warning string, rules ...string) string {
		var rs []string
		for _, r := range rules {
			id, result, _ := strings.Cut(r, "=")
			why := fmt.Sprintf(`"reason":null,"evidence":[{"expected":"e","seen":"the seen of %s","status":404,"curl":"curl","request_id":""}]`, id)
			switch result {
			case "skip":
				why = fmt.Sprintf(`"reason":"the reason of %s","evidence":[]`, id)
			case "pass":
				why = `"reason":null,"evidence":[]`
			}
			rs = append(rs, fmt.Sprintf(`{"id":%q,"level":"MUST","title":"t","spec":"s","result":%q,%s}`, id, result, why))
		}
		warnings, _ := json.Marshal(slices.DeleteFunc([]string{warning}, func(w string) bool { return w == "" }))
		return writeTemp(t, `{"base_url":"http://127.0.0.1:8080/v1","profile":"`+profile+`","mode":"safe","world":"own","warnings":`+string(warnings)+`,"rules":[`+strings.Join(rs, ",")+`],"summary":{}}`)
	}
	report := func(rules ...string) string { return profiled("sandbox", "", rules...) }
	old := report("a.same=pass", "a.worse=pass", "a.better=fail", "a.other=skip", "a.gone=pass")
	new := report("a.same=pass", "a.worse=fail", "a.better=pass", "a.other=expected", "a.new=pass")
	diff := func(t *testing.T, args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		status := runCheck(t.Context(), append([]string{"diff"}, args...), func(string) string { return "" }, &stdout, &stderr, startSelfCheck)
		return status, stdout.String(), stderr.String()
	}
	status, text, _ := diff(t, old, new)
	want := `OLD http://127.0.0.1:8080/v1 (profile sandbox, mode safe, world own), NEW http://127.0.0.1:8080/v1 (profile sandbox, mode safe, world own)
regressed a.worse  pass -> fail  expected: e; seen: the seen of a.worse
improved  a.better  fail -> pass  OLD: expected: e; seen: the seen of a.better
changed   a.other  skip -> expected  expected: e; seen: the seen of a.other
added     a.new  - -> pass
removed   a.gone  pass -> -
6 rules: 1 same, 1 regressed, 1 improved, 1 changed, 1 added, 1 removed
`
	if status != 1 || text != want {
		t.Errorf("check diff: exit %d\n%s\nwant\n%s", status, text, want)
	}
	if status, text, _ := diff(t, "-all", old, new); status != 1 || !strings.Contains(text, "same      a.same  pass -> pass") {
		t.Errorf("-all: %d\n%s", status, text)
	}
	// Why a rule changed, and what each report warned of; profiles that differ, said.
	status, text, _ = diff(t, profiled("sandbox", "", "b.skipped=pass", "b.back=skip"), profiled("domain_adapter", "the world could not be made", "b.skipped=skip", "b.back=pass"))
	want = `OLD http://127.0.0.1:8080/v1 (profile sandbox, mode safe, world own), NEW http://127.0.0.1:8080/v1 (profile domain_adapter, mode safe, world own); the profiles differ: check diff compares verdicts, so a rule whose profile lets it answer otherwise (404 against 409) is same
NEW warning: the world could not be made
changed   b.skipped  pass -> skip  the reason of b.skipped
changed   b.back  skip -> pass  OLD: the reason of b.back
2 rules: 0 same, 0 regressed, 0 improved, 2 changed, 0 added, 0 removed
`
	if status != 0 || text != want {
		t.Errorf("check diff of a skip: exit %d\n%s\nwant\n%s", status, text, want)
	}
	out := filepath.Join(t.TempDir(), "diff.json")
	if status, text, _ := diff(t, old, new, "-format", "json", "-out", out); status != 1 || text != "" {
		t.Errorf("-format json -out: %d %q", status, text)
	}
	var d struct {
		Old, New struct{ BaseURL, Profile, Mode, World string }
		Rules    []struct {
			ID, Change string
			Old, New   *string
			Reason     *string
		}
		Summary struct{ Total, Same, Regressed, Improved, Changed, Added, Removed int }
	}
	b, _ := os.ReadFile(out)
	if err := json.Unmarshal(b, &d); err != nil || len(d.Rules) != 5 || d.Summary.Regressed != 1 || d.Summary.Total != 6 || d.Rules[4].New != nil || d.Rules[3].Old != nil {
		t.Errorf("the JSON comparison: %v %+v\n%s", err, d, b)
	}
	if !bytes.HasPrefix(b, []byte(`{`+"\n"+`  "old": {`+"\n"+`    "base_url"`)) {
		t.Errorf("the JSON comparison's members are not in order:\n%s", b)
	}
	if status, _, _ := diff(t, old, old); status != 0 {
		t.Errorf("a report against itself: exit %d", status)
	}
	for _, tt := range []struct{ file, want string }{
		{writeTemp(t, `not json`), "not a JSON report of the kit"},
		{writeTemp(t, `{"rules":[]}`), "it has no base_url, or no rules"},
		{writeTemp(t, `{"base_url":"x","rules":[{"id":"a"}]}`), "its rule 1 has no id, or no result"},
		{filepath.Join(t.TempDir(), "missing.json"), "no such file"},
	} {
		if status, _, errs := diff(t, tt.file, new); status != 2 || !strings.Contains(errs, tt.file+": ") || !strings.Contains(errs, tt.want) {
			t.Errorf("diff of %s: %d %q, want 2 saying %q", tt.file, status, errs, tt.want)
		}
	}
	if status, _, errs := diff(t, old); status != 2 || !strings.Contains(errs, "want two reports") {
		t.Errorf("diff of one report: %d %q", status, errs)
	}
}

// TestFunctionsWithinBounds: no function of the sandbox's files is over 60 lines or 20
// branches (if, for, a case, && and ||, counted with the functions it holds).
func TestFunctionsWithinBounds(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	files, _ := filepath.Glob("*.go")
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range file.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			lines := fset.Position(fn.Body.Rbrace).Line - fset.Position(fn.Pos()).Line + 1
			branches := 1 // as McCabe counts them (gocyclo too): the decisions, plus one
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				switch x := n.(type) {
				case *ast.IfStmt, *ast.ForStmt, *ast.RangeStmt:
					branches++
				case *ast.CommClause:
					if x.Comm != nil {
						branches++
					}
				case *ast.CaseClause:
					if x.List != nil {
						branches++
					}
				case *ast.BinaryExpr:
					if x.Op == token.LAND || x.Op == token.LOR {
						branches++
					}
				}
				return true
			})
			if lines > 60 || branches > 20 {
				t.Errorf("%s: %s is %d lines and %d branches, over 60 or 20", fset.Position(fn.Pos()), fn.Name.Name, lines, branches)
			}
		}
	}
}

// BenchmarkConformance: a whole run of the kit (its world made and deleted), against a
// sandbox started with -rate 0 (the contract: within 1 s) and as the self-check at the
// default rate, in full mode (within 10 s); the requests each sends.
func BenchmarkConformance(b *testing.B) {
	b.Run("rate_0", func(b *testing.B) {
		ts := httptest.NewServer(benchEnv(b, 0).h)
		b.Cleanup(ts.Close)
		benchKit(b, "-base-url", ts.URL+"/v1", "-key", "sk_test_sandbox_all")
	})
	b.Run("self_check", func(b *testing.B) { benchKit(b) })
}

// benchKit times runs of the kit with args, each of which must pass, and reports the
// requests one sends.
func benchKit(b *testing.B, args ...string) {
	requests := 0
	for b.Loop() {
		var out bytes.Buffer
		if status := runCheck(b.Context(), append(args, "-format", "json"), func(string) string { return "" }, &out, io.Discard, startSelfCheck); status != 0 {
			b.Fatalf("exit status %d\n%s", status, out.String())
		}
		var rep struct{ Summary struct{ Requests int } }
		json.Unmarshal(out.Bytes(), &rep)
		requests = rep.Summary.Requests
	}
	b.ReportMetric(float64(requests), "requests/run")
}

// BenchmarkCheckDiff: check diff of two full reports of the self-check (the contract: within
// 50 ms).
func BenchmarkCheckDiff(b *testing.B) {
	var out bytes.Buffer
	runCheck(b.Context(), []string{"-format", "json", "-mode", "safe"}, func(string) string { return "" }, &out, io.Discard, startSelfCheck)
	dir := b.TempDir()
	old, new := filepath.Join(dir, "old.json"), filepath.Join(dir, "new.json")
	os.WriteFile(old, out.Bytes(), 0o644)
	os.WriteFile(new, bytes.Replace(out.Bytes(), []byte(`"result": "pass"`), []byte(`"result": "fail"`), 3), 0o644)
	for b.Loop() {
		if status := runCheck(b.Context(), []string{"diff", old, new}, func(string) string { return "" }, io.Discard, io.Discard, startSelfCheck); status != 1 {
			b.Fatalf("check diff: exit %d", status)
		}
	}
}
