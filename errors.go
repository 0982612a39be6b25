// errors.go is the floor every other file stands on. First the error answers (the codes,
// the problem type, the one function that writes a problem); then what the files above
// share beneath them: writing a body and JSON, timestamps and a dataset's instants, dataset
// faults and strict decoding, the Prefer header, and a timeline's happenings.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Error answers.

// code is an error code of the contract: every error answer carries exactly one.
type code string

const (
	codeInvalidCursor        code = "invalid_cursor"
	codeMalformedJSON        code = "malformed_json"
	codeMissingAPIKey        code = "missing_api_key"
	codeInvalidAPIKey        code = "invalid_api_key"
	codeExpiredAPIKey        code = "expired_api_key"
	codeRevokedAPIKey        code = "revoked_api_key"
	codeInsufficientScope    code = "insufficient_scope"
	codeNotFound             code = "not_found"
	codeRouteNotFound        code = "route_not_found"
	codeMethodNotAllowed     code = "method_not_allowed"
	codeBodyTooLarge         code = "body_too_large"
	codeUnknownParameter     code = "unknown_parameter"
	codeInvalidParameter     code = "invalid_parameter"
	codeRateLimited          code = "rate_limited"
	codeInternalError        code = "internal_error"
	codeProviderNotConfirmed code = "provider_not_confirmed"
	codeLiveNotReleased      code = "live_not_released"
	codeProviderUnavailable  code = "provider_unavailable"
)

// codeStatus is the one table from an error code to its HTTP status.
var codeStatus = map[code]int{
	codeInvalidCursor:        http.StatusBadRequest,
	codeMalformedJSON:        http.StatusBadRequest,
	codeMissingAPIKey:        http.StatusUnauthorized,
	codeInvalidAPIKey:        http.StatusUnauthorized,
	codeExpiredAPIKey:        http.StatusUnauthorized,
	codeRevokedAPIKey:        http.StatusUnauthorized,
	codeInsufficientScope:    http.StatusForbidden,
	codeNotFound:             http.StatusNotFound,
	codeRouteNotFound:        http.StatusNotFound,
	codeMethodNotAllowed:     http.StatusMethodNotAllowed,
	codeBodyTooLarge:         http.StatusRequestEntityTooLarge,
	codeUnknownParameter:     http.StatusUnprocessableEntity,
	codeInvalidParameter:     http.StatusUnprocessableEntity,
	codeRateLimited:          http.StatusTooManyRequests,
	codeInternalError:        http.StatusInternalServerError,
	codeProviderNotConfirmed: http.StatusBadGateway,
	codeLiveNotReleased:      http.StatusServiceUnavailable,
	codeProviderUnavailable:  http.StatusServiceUnavailable,
}

// apiError is an error a client is told about: its code decides the status, detail says
// what to do about it, and param, when set, names the parameter or header at fault.
type apiError struct {
	code   code
	detail string
	param  *string
}

func (e *apiError) Error() string { return string(e.code) + ": " + e.detail }

func (e *apiError) status() int { return codeStatus[e.code] }

func paramError(c code, param, detail string) *apiError {
	return &apiError{code: c, detail: detail, param: &param}
}

// The errors that do not depend on the request are made once.
var (
	errRouteNotFound = &apiError{code: codeRouteNotFound, detail: "No operation is served at this path. The operations are under /v1; see /v1/openapi.json."}
	errInternal      = &apiError{code: codeInternalError, detail: "The sandbox failed unexpectedly. The failure is logged with this request_id."}
)

// problem is the body of every error answer: RFC 9457 problem details with the code and
// the request id (and param, when a parameter is at fault).
type problem struct {
	Type      string  `json:"type"`
	Title     string  `json:"title"`
	Status    int     `json:"status"`
	Detail    string  `json:"detail"`
	Code      code    `json:"code"`
	Param     *string `json:"param,omitempty"`
	RequestID string  `json:"request_id"`
}

// statusTitle is a status's reason phrase as RFC 9110 names it: Go's StatusText keeps the
// older names of 413 and 422.
func statusTitle(status int) string {
	switch status {
	case http.StatusRequestEntityTooLarge:
		return "Content Too Large"
	case http.StatusUnprocessableEntity:
		return "Unprocessable Content"
	}
	return http.StatusText(status)
}

// writeProblem writes every error answer of the service. Headers an error needs besides
// (Allow, WWW-Authenticate, Retry-After) are set before. The body is appended by hand, as
// the problem type encodes it (BenchmarkRejected: encoding/json costs more); a test holds
// the two to the same bytes.
func writeProblem(w http.ResponseWriter, requestID string, e *apiError) {
	writeBody(w, e.status(), problemContentType, appendProblem(make([]byte, 0, 256), e, requestID))
}

func appendProblem(b []byte, e *apiError, requestID string) []byte {
	status := e.status()
	b = append(b, `{"type":"about:blank","title":`...)
	b = appendJSONString(b, statusTitle(status))
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, `,"detail":`...)
	b = appendJSONString(b, e.detail)
	b = append(b, `,"code":`...)
	b = appendJSONString(b, string(e.code))
	if e.param != nil {
		b = append(b, `,"param":`...)
		b = appendJSONString(b, *e.param)
	}
	b = append(b, `,"request_id":`...)
	b = appendJSONString(b, requestID)
	return append(b, '}')
}

// Writing a body, and JSON.

// The types of the answers' bodies.
const (
	jsonContentType    = "application/json"
	problemContentType = "application/problem+json"
	htmlContentType    = "text/html; charset=utf-8"
)

// writeBody writes every answer that has a body: its type, its length (the parts' total),
// the status, then the parts. An answer in parts (a tracking view the clock cuts short) is
// copied into the connection's buffer rather than assembled first.
func writeBody(w http.ResponseWriter, status int, contentType string, parts ...[]byte) {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	h := w.Header()
	h.Set("Content-Type", contentType)
	h.Set("Content-Length", strconv.Itoa(n))
	w.WriteHeader(status)
	for _, p := range parts {
		w.Write(p)
	}
}

// marshalJSON is the one way JSON is encoded: compact, with <, > and & left as they are.
func marshalJSON(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// appendJSONString appends s as a JSON string exactly as encoding/json writes it with HTML
// escaping off (and as slog's JSONHandler does): bytes that are not UTF-8 become U+FFFD,
// U+2028 and U+2029 are escaped. Orders (a million at start-up) and the access log's line
// are written with it; a test holds it to encoding/json.
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c < 0x80 && c != '"' && c != '\\' {
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if c >= 0x80 && !(r == utf8.RuneError && size == 1) && r != '\u2028' && r != '\u2029' {
			i += size
			continue
		}
		dst = append(dst, s[start:i]...)
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c == '\n':
			dst = append(dst, `\n`...)
		case c == '\r':
			dst = append(dst, `\r`...)
		case c == '\t':
			dst = append(dst, `\t`...)
		case c < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		case r == '\u2028':
			dst = append(dst, `\u2028`...)
		case r == '\u2029':
			dst = append(dst, `\u2029`...)
		default:
			dst = append(dst, `\ufffd`...)
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// Numbers, timestamps, and the instants of a dataset's schedule.

// parseWhole reads a whole number written in ASCII decimal digits only (no sign, space or
// fraction; leading zeros allowed) that is at most most.
func parseWhole(s string, most int) (int, bool) {
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		n = n*10 + int(s[i]-'0')
		if n > most {
			return 0, false
		}
	}
	return n, s != ""
}

// rfc3339 is the strict shape of an RFC 3339 date-time with an offset: two-digit fields in
// range (time.Parse takes a one-digit hour and offsets of 24 hours or more), T or t, Z or z.
var rfc3339 = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}[Tt](?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d+)?(?:[Zz]|[+-](?:[01]\d|2[0-3]):[0-5]\d)$`)

var (
	errNotRFC3339   = errors.New("is not an RFC 3339 timestamp with an offset and a four-digit year, such as 2026-11-01T09:30:00Z")
	errOutOfRFC3339 = errors.New("is an instant outside the years 0000 to 9999 in UTC, which RFC 3339 cannot write")
)

// The years RFC 3339 can write.
const (
	firstRFC3339Year = 0
	lastRFC3339Year  = 9999
)

// parseTimestamp reads a strict RFC 3339 date-time with an explicit offset and returns the
// same instant in UTC, or why it cannot. Instants whose UTC year is outside 0000..9999 are
// refused: they could not be written back as RFC 3339.
func parseTimestamp(s string) (time.Time, error) {
	if !rfc3339.MatchString(s) {
		return time.Time{}, errNotRFC3339
	}
	t, err := time.Parse(time.RFC3339Nano, strings.ToUpper(s))
	if err != nil {
		return time.Time{}, errNotRFC3339 // a day the month does not have
	}
	if t = t.UTC(); !writable(t) {
		return time.Time{}, errOutOfRFC3339
	}
	return t, nil
}

// writable reports whether RFC 3339 can write t: its UTC year is 0000 to 9999.
func writable(t time.Time) bool {
	t = t.UTC()
	return t.Year() >= firstRFC3339Year && t.Year() <= lastRFC3339Year
}

// formatTimestamp writes an instant as responses do: UTC, suffix Z, fractional seconds
// only when non-zero.
func formatTimestamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// relativeInstant is an instant of a dataset's schedule relative to the start instant:
// start, or start then + or - then an unsigned Go duration (digits, an optional fraction, a
// unit), lower case, no spaces.
var relativeInstant = regexp.MustCompile(`^start(?:([+-])((?:[0-9]+(?:\.[0-9]+)?(?:ns|us|µs|μs|ms|s|m|h))+))?$`)

var errNotInstant = errors.New("is not an instant: RFC 3339 with an offset (2026-11-01T09:30:00Z), or relative to the start instant (start, start+90s, start-10m, start+1h30m)")

// parseInstant reads an instant of a dataset's schedule: strict RFC 3339 with an offset, or
// relative to start. Instants outside the years 0000 to 9999 are refused.
func parseInstant(s string, start time.Time) (time.Time, error) {
	m := relativeInstant.FindStringSubmatch(s)
	if m == nil {
		if !strings.HasPrefix(s, "start") {
			if t, err := parseTimestamp(s); err == nil || errors.Is(err, errOutOfRFC3339) {
				return t, err
			}
		}
		return time.Time{}, errNotInstant
	}
	d, err := time.ParseDuration("0s" + m[2]) // "" when s is start alone
	if err != nil {
		return time.Time{}, errOutOfRFC3339 // past what a duration holds: some 292 years
	}
	if m[1] == "-" {
		d = -d
	}
	t := start.Add(d).UTC()
	if !writable(t) {
		return time.Time{}, errOutOfRFC3339
	}
	return t, nil
}

// instant is a time as the indexes keep it: seconds and nanoseconds since 1970 in UTC. It
// holds no pointer for the collector to walk (a time.Time holds one).
type instant struct {
	sec  int64
	nsec int32
}

// dawn is before every instant and never after every one. Neither is an instant a dataset
// can name (those lie in the years 0000 to 9999), so they stand for what is absent: a
// shipment that always existed is created at dawn, a key without an expiry expires never.
var (
	dawn  = instant{math.MinInt64, 0}
	never = instant{math.MaxInt64, 0}
)

func instantOf(t time.Time) instant { return instant{t.Unix(), int32(t.Nanosecond())} }

func (a instant) after(b instant) bool { return a.sec > b.sec || a.sec == b.sec && a.nsec > b.nsec }

// time is the instant as a time.Time in UTC; dawn and never are not instants to write.
func (a instant) time() time.Time { return time.Unix(a.sec, int64(a.nsec)).UTC() }

// formatInstant writes an instant as responses write timestamps.
func formatInstant(a instant) string { return formatTimestamp(a.time()) }

// compare is -1, 0 or +1 as a is before, at or after b.
func (a instant) compare(b instant) int {
	switch {
	case a.after(b):
		return 1
	case b.after(a):
		return -1
	}
	return 0
}

// Dataset faults. A dataset that cannot be served is refused at start with the file, the
// JSON path of the fault and the reason.

// datasetError is a fault in a dataset.
type datasetError struct {
	file   string
	path   string
	reason string
}

func (e *datasetError) Error() string {
	return fmt.Sprintf("dataset %s: %s: %s", e.file, e.path, e.reason)
}

// decodeStrict decodes one JSON object into v, a pointer to a struct of json-tagged
// fields. Its members are judged first, in the order written: a name that is not exactly
// one of v's fields is unknown, and a name given twice, also in another case, is refused
// (encoding/json would match names case-insensitively and let the last one win). The
// error names the JSON path.
func decodeStrict(raw json.RawMessage, path string, v any) error {
	if err := checkMembers(raw, path, reflect.TypeOf(v).Elem()); err != nil {
		return err
	}
	err := json.Unmarshal(raw, v)
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		if typeErr.Field != "" {
			path += "." + typeErr.Field
		}
		return &datasetError{path: path, reason: fmt.Sprintf("must be %s, not %s", jsonKind(typeErr.Type.Kind().String()), typeErr.Value)}
	}
	if err != nil {
		return &datasetError{path: path, reason: err.Error()}
	}
	return nil
}

// checkMembers judges the member names of the JSON object raw against the fields of t.
// A value that is not an object is left to json.Unmarshal to refuse.
func checkMembers(raw json.RawMessage, path string, t reflect.Type) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	var seen []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return &datasetError{path: path, reason: err.Error()}
		}
		name := tok.(string)
		for _, earlier := range seen {
			if strings.EqualFold(earlier, name) {
				return &datasetError{path: path + "." + name, reason: fmt.Sprintf("duplicate member: %q is given already", earlier)}
			}
		}
		seen = append(seen, name)
		if !hasField(t, name) {
			return &datasetError{path: path + "." + name, reason: "unknown field"}
		}
		if err := dec.Decode(&json.RawMessage{}); err != nil {
			return &datasetError{path: path + "." + name, reason: err.Error()}
		}
	}
	return nil
}

// hasField reports whether struct type t has a field whose json name is exactly name.
func hasField(t reflect.Type, name string) bool {
	for i := range t.NumField() {
		if jsonName, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); jsonName == name {
			return true
		}
	}
	return false
}

// jsonKind names a Go kind as the JSON type a dataset author wrote.
func jsonKind(kind string) string {
	switch kind {
	case "string":
		return "a string"
	case "bool":
		return "true or false"
	case "slice", "array":
		return "an array"
	case "struct", "map", "ptr":
		return "an object"
	default:
		return "a number"
	}
}

// required refuses an empty value of a required field.
func required(path, value string) error {
	if value == "" {
		return &datasetError{path: path, reason: "required, and must not be empty"}
	}
	return nil
}

// oneOf refuses a value outside its vocabulary.
func oneOf(path, what, value string, allowed []string) error {
	if err := required(path, value); err != nil {
		return err
	}
	for _, a := range allowed {
		if a == value {
			return nil
		}
	}
	return &datasetError{path: path, reason: fmt.Sprintf("unknown %s %q; want one of %s", what, value, strings.Join(allowed, ", "))}
}

// maxIDBytes bounds every id, reference, key and tracking number of a dataset: a key must
// fit a header, and an order id a cursor of at most maxCursorLen.
const maxIDBytes = 255

// checkID refuses an id, reference, key or tracking number that is empty, longer than
// maxIDBytes or holds a control character.
func checkID(path, value string) error {
	switch {
	case value == "":
		return required(path, value)
	case len(value) > maxIDBytes:
		return &datasetError{path: path, reason: fmt.Sprintf("is %d bytes long; at most %d", len(value), maxIDBytes)}
	case strings.ContainsFunc(value, unicode.IsControl):
		return &datasetError{path: path, reason: "holds a control character"}
	}
	return nil
}

// timestampField reads a dataset timestamp (not a raw event's): it must be strict RFC 3339
// with an offset, or the dataset is refused.
func timestampField(path, value string) (time.Time, error) {
	t, err := parseTimestamp(value)
	if err != nil {
		return time.Time{}, &datasetError{path: path, reason: strconv.Quote(value) + " " + err.Error()}
	}
	return t, nil
}

// instantField reads an instant of the dataset's schedule (an order's or a shipment's):
// RFC 3339, or relative to start; anything else refuses the dataset.
func instantField(path, value string, start time.Time) (time.Time, error) {
	t, err := parseInstant(value, start)
	if err != nil {
		return time.Time{}, &datasetError{path: path, reason: strconv.Quote(value) + " " + err.Error()}
	}
	return t, nil
}

// Simulated answers: a test-environment client may ask, with the RFC 7240 Prefer header,
// for an answer the sandbox never gives on its own (code=429|500|502|503) and/or for a
// delay (delay=MS), to rehearse how its integration copes, and for the instant its
// request's resources are judged at (clock="<RFC 3339>"), so that parallel tests on one
// tenant each keep their own time.

const maxPreferDelay = 10 * time.Second

// simulatedCodes are the statuses a client may ask for, with the answer the real API would give.
var simulatedCodes = map[string]*apiError{
	"429": {code: codeRateLimited, detail: "Simulated at your request (Prefer: code=429): the rate limit is reached. Retry after the Retry-After seconds."},
	"500": {code: codeInternalError, detail: "Simulated at your request (Prefer: code=500): an unexpected service failure."},
	"502": {code: codeProviderNotConfirmed, detail: "Simulated at your request (Prefer: code=502): the provider did not confirm the operation; do not retry a booking blindly."},
	"503": {code: codeProviderUnavailable, detail: "Simulated at your request (Prefer: code=503): the provider is unavailable. Retry after the Retry-After seconds."},
}

// preference is what a request's Prefer header asks of the sandbox.
type preference struct {
	answer  *apiError // nil, or one of simulatedCodes
	delay   time.Duration
	clock   *time.Time // the instant the request's resources are judged at; nil: the tenant's clock
	applied string     // the Preference-Applied value, "" when nothing is applied
}

// maxPreferences is how many preferences of a request are read; the rest are ignored, so
// that a long header costs no more than a short one.
const maxPreferences = 16

var errPreferClock = paramError(codeInvalidParameter, "Prefer", `Prefer clock must be an RFC 3339 timestamp with an offset, such as clock="2026-11-01T09:30:00Z".`)

// parsePrefer reads the Prefer header fields (RFC 7240, section 2): comma-separated
// preferences, each a token with an optional value (token or quoted string) and optional
// parameters after ";". Names are case-insensitive; the first instance of a preference
// counts; preferences other than code, delay and (where readClock) clock are ignored, as
// the RFC says. Faults are judged in the order sent.
func parsePrefer(fields []string, readClock bool) (preference, *apiError) {
	var p preference
	var seenCode, seenDelay, seenClock bool
	var applied []string
	read := 0
	for _, field := range fields {
		for rest := field; rest != "" && read < maxPreferences; read++ {
			var name, value string
			name, value, rest = nextPreference(rest)
			switch {
			case strings.EqualFold(name, "code") && !seenCode:
				seenCode = true
				if p.answer = simulatedCodes[value]; p.answer == nil {
					return p, paramError(codeInvalidParameter, "Prefer", "Prefer code must be one of 429, 500, 502, 503.")
				}
				applied = append(applied, "code="+value)
			case strings.EqualFold(name, "delay") && !seenDelay:
				seenDelay = true
				ms, ok := parseWhole(value, int(maxPreferDelay/time.Millisecond))
				if !ok {
					return p, paramError(codeInvalidParameter, "Prefer", "Prefer delay must be a whole number of milliseconds from 0 to 10000.")
				}
				p.delay = time.Duration(ms) * time.Millisecond
				applied = append(applied, "delay="+strconv.Itoa(ms))
			case readClock && strings.EqualFold(name, "clock") && !seenClock:
				seenClock = true
				at, err := parseTimestamp(value)
				if err != nil {
					return p, errPreferClock
				}
				p.clock = &at
				applied = append(applied, `clock="`+formatTimestamp(at)+`"`)
			}
		}
	}
	p.applied = strings.Join(applied, ", ")
	return p, nil
}

// nextPreference reads the first preference off s in one pass: its name and value (a token,
// or a quoted string's content), skipping its parameters and the comma that ends it.
func nextPreference(s string) (name, value, rest string) {
	i := strings.IndexAny(s, "=;,")
	if i < 0 {
		return strings.TrimSpace(s), "", ""
	}
	name = strings.TrimSpace(s[:i])
	if s[i] == '=' {
		v := strings.TrimLeft(s[i+1:], " \t")
		i = len(s) - len(v)
		if v != "" && v[0] == '"' {
			end := 1
			for end < len(v) && v[end] != '"' {
				if v[end] == '\\' {
					end++
				}
				end++
			}
			value = unquote(v[:min(end+1, len(v))])
			i += min(end+1, len(v))
		} else {
			end := strings.IndexAny(v, ";,")
			if end < 0 {
				end = len(v)
			}
			value = strings.TrimSpace(v[:end])
			i += end
		}
	}
	for quoted := false; i < len(s); i++ { // parameters, up to the comma outside quotes
		switch {
		case quoted && s[i] == '\\':
			i++
		case s[i] == '"':
			quoted = !quoted
		case !quoted && s[i] == ',':
			return name, value, s[i+1:]
		}
	}
	return name, value, ""
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

// A timeline is what a dataset schedules to happen, as the landing page lists it: an
// order's import and its changes, a shipment's creation and its events scheduled with after.

// happening is one entry of a tenant's timeline: one thing at one instant.
type happening struct {
	at   time.Time
	kind happeningKind
	id   string // the order's or the shipment's
	what string // what happens: "imported", "now fulfilled", an event's status and description
}

// happeningKind orders the entries of one instant.
type happeningKind uint8

const (
	shipmentCreated happeningKind = iota
	orderImported
	orderChanged
	shipmentEvent
)

// sortHappenings puts a timeline in order: oldest first, ties by kind, then id, then as given.
func sortHappenings(h []happening) {
	slices.SortStableFunc(h, func(a, b happening) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		if a.kind != b.kind {
			return int(a.kind) - int(b.kind)
		}
		return strings.Compare(a.id, b.id)
	})
}

// around is the last n happenings at or before at and the next n after it of a timeline
// kept in sorted parts, and how many more there are on each side.
func around(at time.Time, n int, parts ...[]happening) (past, future []happening, morePast, moreFuture int) {
	for _, part := range parts {
		k := sort.Search(len(part), func(k int) bool { return part[k].at.After(at) })
		past = append(past, part[max(0, k-n):k]...)
		future = append(future, part[k:min(len(part), k+n)]...)
		morePast += k
		moreFuture += len(part) - k
	}
	sortHappenings(past)
	sortHappenings(future)
	past, future = past[max(0, len(past)-n):], future[:min(len(future), n)]
	return past, future, morePast - len(past), moreFuture - len(future)
}
