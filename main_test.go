package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The test harness: every request of the suite goes through the real handler chain
// (server.handler, as run serves it), and every response is checked against the rules
// that hold for all responses and against the OpenAPI document.

// testNow is the fake clock's start: after sk_test_sandbox_expired's expiry.
var testNow = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

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
	data   []byte // a dataset; nil: the embedded default
	seed   int    // -seed-orders
	rate   int    // -rate; 0 here means the default 25, -1 means off
	secret string // -cursor-secret
	step   time.Duration
	extra  []route
}

// env is one sandbox under test.
type env struct {
	t     testing.TB
	h     http.Handler
	logs  *lockedBuffer
	clock *fakeClock
}

func newEnv(t testing.TB, o envOptions) *env {
	t.Helper()
	data := o.data
	if data == nil {
		data = defaultDataset
	}
	logs := &lockedBuffer{}
	log := slog.New(newLineHandler(logs))
	sb, _, err := loadDataset("test", data, o.seed, log)
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
	s, err := newServer(sb, serverOptions{rate: rate, cursorSecret: o.secret, log: log, now: clock.now, stopping: make(chan struct{})})
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, h: s.handler(o.extra...), logs: logs, clock: clock}
}

// reply is a response as the tests look at it.
type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) String() string { return fmt.Sprintf("%d %s", r.status, r.body) }

// problem is an error body.
type problem struct {
	Type      string `json:"type"`
	Title     string `json:"title"`
	Status    int    `json:"status"`
	Detail    string `json:"detail"`
	Code      string `json:"code"`
	Param     string `json:"param"`
	RequestID string `json:"request_id"`
}

func (r reply) problem(t testing.TB) problem {
	t.Helper()
	var p problem
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		t.Fatalf("problem body %s: %v", r.body, err)
	}
	return p
}

// do sends r through the handler chain and checks the response.
func (e *env) do(r *http.Request) reply {
	e.t.Helper()
	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, r)
	res := rec.Result()
	rep := reply{status: res.StatusCode, header: res.Header, body: rec.Body.Bytes()}
	checkResponse(e.t, r, rep)
	return rep
}

// get sends GET target with key as a Bearer credential ("" for none) and header pairs.
func (e *env) get(target, key string, headerPairs ...string) reply {
	e.t.Helper()
	return e.do(newRequest(http.MethodGet, target, key, headerPairs...))
}

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

var requestIDPattern = regexp.MustCompile(`^req_[0-9a-z]{20}$`)

// checkResponse checks what holds for every response: the common headers, an exact
// Content-Length, problem+json for every error with the request id of the header, and
// conformance to the OpenAPI document.
func checkResponse(t testing.TB, r *http.Request, rep reply) {
	t.Helper()
	id := rep.header.Get("Request-Id")
	if !requestIDPattern.MatchString(id) {
		t.Errorf("%s %s: Request-Id = %q, want req_ and 20 characters", r.Method, r.URL, id)
	}
	for name, want := range map[string]string{"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff", "Content-Length": strconv.Itoa(len(rep.body))} {
		if got := rep.header.Get(name); got != want {
			t.Errorf("%s %s: %s = %q, want %q", r.Method, r.URL, name, got, want)
		}
	}
	if rep.status >= 400 {
		if ct := rep.header.Get("Content-Type"); ct != "application/problem+json" {
			t.Errorf("%s %s: error Content-Type = %q, want application/problem+json", r.Method, r.URL, ct)
		}
		p := rep.problem(t)
		if p.Type != "about:blank" || p.Status != rep.status || p.Title != http.StatusText(rep.status) || p.RequestID != id || p.Detail == "" || p.Code == "" {
			t.Errorf("%s %s: problem %+v does not match status %d and Request-Id %s", r.Method, r.URL, p, rep.status, id)
		}
	} else if ct := rep.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: Content-Type = %q, want application/json", r.Method, r.URL, ct)
	}
	if err := theOpenAPI(t).checkResponse(r, rep); err != nil {
		t.Errorf("%s %s answered %d, which the OpenAPI document does not allow: %v\nbody: %s", r.Method, r.URL, rep.status, err, rep.body)
	}
}

// wantProblem checks an error response's status, code and param.
func wantProblem(t testing.TB, rep reply, status int, code, param string) problem {
	t.Helper()
	if rep.status != status {
		t.Fatalf("status = %d, want %d; body %s", rep.status, status, rep.body)
	}
	p := rep.problem(t)
	if p.Code != code || p.Param != param {
		t.Errorf("code, param = %q, %q; want %q, %q (body %s)", p.Code, p.Param, code, param, rep.body)
	}
	return p
}

// withoutRequestID is an error body with its request id blanked, for comparing bodies.
func withoutRequestID(t testing.TB, body []byte) string {
	t.Helper()
	return regexp.MustCompile(`"request_id":"req_[0-9a-z]{20}"`).ReplaceAllString(string(body), `"request_id":"-"`)
}

// The OpenAPI document as the tests read it, with a validator for the JSON Schema keywords
// it uses. A keyword the validator does not know fails the check, so that the document
// cannot lean on a rule nobody checks.

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
	openAPIDoc  *openAPI
	openAPIErr  error
)

func theOpenAPI(t testing.TB) *openAPI {
	t.Helper()
	openAPIOnce.Do(func() { openAPIDoc, openAPIErr = parseOpenAPI(openAPIDocument) })
	if openAPIErr != nil {
		t.Fatalf("openapi.json: %v", openAPIErr)
	}
	return openAPIDoc
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
	for _, dp := range d.paths {
		if !dp.match.MatchString(p) {
			continue
		}
		method := strings.ToLower(r.Method)
		if method == "head" {
			method = "get"
		}
		op, _ := dp.item[method].(map[string]any)
		if op == nil {
			if status != http.StatusMethodNotAllowed {
				return nil, fmt.Errorf("%s %s is not documented", r.Method, dp.template)
			}
			op = dp.item["get"].(map[string]any)
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
	return d.resolve(map[string]any{"$ref": "#/components/responses/RouteNotFound"}), nil
}

// checkResponse validates a response's body and headers against the document.
func (d *openAPI) checkResponse(r *http.Request, rep reply) error {
	resp, err := d.response(r, rep.status)
	if err != nil {
		return err
	}
	ct := rep.header.Get("Content-Type")
	media, _ := resp["content"].(map[string]any)[ct].(map[string]any)
	if media == nil {
		return fmt.Errorf("Content-Type %q is not documented", ct)
	}
	if schema := media["schema"]; schema != nil && r.Method != http.MethodHead {
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
	}
	for name, values := range rep.header {
		switch name {
		case "Content-Type", "Content-Length", "Date":
			continue
		}
		h := documented[name]
		if h == nil {
			return fmt.Errorf("header %s is not documented for this response", name)
		}
		for _, v := range values {
			if err := d.validate(h["schema"], v, "header "+name, nil); err != nil {
				return err
			}
		}
	}
	return nil
}

func asMap(v any) map[string]any { m, _ := v.(map[string]any); return m }

// schemaKeywords are the keywords the validator applies; annotations are accepted and
// ignored; anything else is an error.
var annotations = map[string]bool{"description": true, "examples": true, "format": true, "default": true, "title": true}

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
		case "type", "enum", "required", "properties", "additionalProperties", "items", "pattern", "minimum", "maximum", "minLength":
		default:
			if !annotations[kw] {
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

// The default sandbox: every fixture of the contract, as the API shows it.

func TestTrackingViewsOfEveryFixture(t *testing.T) {
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
			rep := e.get(tt.target, tt.key)
			if rep.status != 200 || string(rep.body) != tt.want {
				t.Errorf("GET %s = %s\nwant 200 %s", tt.target, rep, tt.want)
			}
		})
	}
}

func TestTrackingByNumber(t *testing.T) {
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
			rep := e.get("/v1/tracking/"+tt.number, tt.key)
			if tt.wantStatus == 404 {
				wantProblem(t, rep, 404, "not_found", "")
				return
			}
			byID := e.get("/v1/shipments/"+tt.wantShipment+"/tracking", tt.key)
			if rep.status != 200 || !bytes.Equal(rep.body, byID.body) {
				t.Errorf("GET /v1/tracking/%s = %s\nwant the view of %s: %s", tt.number, rep, tt.wantShipment, byID.body)
			}
		})
	}
}

const (
	sandboxOrderJSON = `{"id":"ord_sbx_0001","merchant_reference":"SBX-ORDER-1001","platform":"shopify","status":"unfulfilled","shipment_id":null,"created_at":"2026-11-01T09:30:00Z"}`
	otherOrderJSON   = `{"id":"ord_other_0001","merchant_reference":"OTH-ORDER-1","platform":"etsy","status":"fulfilled","shipment_id":"shp_other_1","created_at":"2026-10-14T09:00:00Z"}`
)

func TestOrdersOfTheDefaultDataset(t *testing.T) {
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
		{"/v1/orders?created_from=2026-11-01T10:30:00+01:00", "sk_test_sandbox_all", `{"data":[` + sandboxOrderJSON + `],"pagination":{"limit":20,"next_cursor":null,"has_more":false}}`},
		{"/v1/orders?status=fulfilled", "sk_test_sandbox_all", `{"data":[],"pagination":{"limit":20,"next_cursor":null,"has_more":false}}`},
		{"/v1/orders?created_from=2026-11-01T09:30:00.000000001Z", "sk_test_sandbox_all", `{"data":[],"pagination":{"limit":20,"next_cursor":null,"has_more":false}}`},
		{"/v1/orders?created_to=2026-11-01T09:29:59.999Z", "sk_test_sandbox_all", `{"data":[],"pagination":{"limit":20,"next_cursor":null,"has_more":false}}`},
	}
	for _, tt := range tests {
		rep := e.get(tt.target, tt.key)
		if rep.status != 200 || string(rep.body) != tt.want {
			t.Errorf("GET %s (%s) = %s\nwant 200 %s", tt.target, tt.key, rep, tt.want)
		}
	}
}

// TestNoMarketplaceSecretsInResponses: the stored orders carry a marketplace token and raw
// marketplace data; no response of any operation shows any part of either.
func TestNoMarketplaceSecretsInResponses(t *testing.T) {
	e := newEnv(t, envOptions{seed: 50})
	var secrets []string
	var file struct {
		Orders []orderRecord `json:"orders"`
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
			rep := e.get(target, key)
			for _, s := range secrets {
				if bytes.Contains(bytes.ToLower(rep.body), bytes.ToLower([]byte(s))) {
					t.Errorf("GET %s (%s) shows %q: %s", target, key, s, rep.body)
				}
			}
		}
	}
	var order map[string]any
	if err := json.Unmarshal(e.get("/v1/orders/ord_sbx_0001", "sk_test_sandbox_all").body, &order); err != nil {
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

func TestEveryKeyOnEveryOperation(t *testing.T) {
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
			t.Run(tt.key+"/"+op.name, func(t *testing.T) {
				want := tt.tracking
				if op.scope == "orders:read" {
					want = tt.orders
				}
				rep := e.get(op.target, tt.key)
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
		rep := e.get(op.target, "sk_test_other_all")
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
		{"several spaces after the scheme", []string{"Authorization", "Bearer   sk_test_sandbox_all"}, 200, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := e.get("/v1/orders", "", tt.headers...)
			if tt.status == 200 {
				if rep.status != 200 {
					t.Fatalf("status = %s, want 200", rep)
				}
				return
			}
			wantProblem(t, rep, tt.status, tt.code, "")
			if got := rep.header.Get("WWW-Authenticate"); got != `Bearer realm="sandbox"` {
				t.Errorf("WWW-Authenticate = %q", got)
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
		foreign, missing := e.get(p.foreign, p.key), e.get(p.missing, p.key)
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

func TestRoutesMethodsAndPaths(t *testing.T) {
	e := newEnv(t, envOptions{})
	tests := []struct {
		method, target string
		status         int
		code           string
	}{
		{"GET", "/", 404, "route_not_found"},
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
		// Escaped dots are not dot-segments to the router: the id ".." is looked up as it is.
		{"GET", "/v1/orders/%2E%2E", 404, "not_found"},
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
		{"HEAD", "/v1/orders/ord_sbx_0001", 200, ""},
		{"GET", "/healthz", 200, ""},
		{"GET", "/v1/openapi.json", 200, ""},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.target, func(t *testing.T) {
			rep := e.do(newRequest(tt.method, tt.target, "sk_test_sandbox_all"))
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
	if rep := e.get("/healthz", ""); string(rep.body) != `{"status":"ok"}` {
		t.Errorf("GET /healthz = %s, want {\"status\":\"ok\"}", rep)
	}
}

// TestServedOverTCP checks what only a real connection shows: HEAD sends no body, an
// unclean path is not redirected, OPTIONS * is the handler's, and a CONNECT gets JSON.
func TestServedOverTCP(t *testing.T) {
	e := newEnv(t, envOptions{})
	ts := httptest.NewUnstartedServer(e.h)
	ts.Config = newHTTPServer(defaultConfig(), e.h)
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

// TestCheckOrder: when a request has several faults, the first check in the contract's
// order answers: route/method, body size, key, live, rate limit, scope, Prefer,
// parameters (422, then 400), resource.
func TestCheckOrder(t *testing.T) {
	big := strings.Repeat("x", maxBodyBytes+1)
	tests := []struct {
		name, method, target, key, body string
		headers                         []string
		status                          int
		code                            string
	}{
		{"unknown route before method", "POST", "/v1/nope", "", "", nil, 404, "route_not_found"},
		{"method before body size", "POST", "/v1/orders", "", big, nil, 405, "method_not_allowed"},
		{"body size before key", "GET", "/v1/orders", "", big, nil, 413, "body_too_large"},
		{"key before live", "GET", "/v1/orders?limit=0", "sk_live_nope", "", nil, 401, "invalid_api_key"},
		{"key before parameters", "GET", "/v1/orders?limit=0", "", "", nil, 401, "missing_api_key"},
		{"live before scope and parameters", "GET", "/v1/orders?limit=0", "sk_live_sandbox_all", "", []string{"Prefer", "code=500"}, 503, "live_not_released"},
		{"scope before Prefer", "GET", "/v1/orders", "sk_test_sandbox_tracking", "", []string{"Prefer", "code=500"}, 403, "insufficient_scope"},
		{"scope before parameters", "GET", "/v1/orders?limit=0", "sk_test_sandbox_none", "", nil, 403, "insufficient_scope"},
		{"Prefer before parameters", "GET", "/v1/orders?limit=0", "sk_test_sandbox_all", "", []string{"Prefer", "code=502"}, 502, "provider_not_confirmed"},
		{"bad Prefer before parameters", "GET", "/v1/orders?limit=0", "sk_test_sandbox_all", "", []string{"Prefer", "code=200"}, 422, "invalid_parameter"},
		{"422 before 400", "GET", "/v1/orders?cursor=garbage&limit=0", "sk_test_sandbox_all", "", nil, 422, "invalid_parameter"},
		{"parameters before resource", "GET", "/v1/orders/ord_nope?x=1", "sk_test_sandbox_all", "", nil, 422, "unknown_parameter"},
		{"expired before scope", "GET", "/v1/orders", "sk_test_sandbox_expired", "", nil, 401, "expired_api_key"},
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
			param := ""
			if tt.code == "invalid_parameter" || tt.code == "unknown_parameter" {
				param = map[string]string{"bad Prefer before parameters": "Prefer", "422 before 400": "limit", "parameters before resource": "x"}[tt.name]
			}
			wantProblem(t, e.do(r), tt.status, tt.code, param)
		})
	}
}
