// errors.go holds the errors of the service: the codes and the one table from a code to its
// status, the one function that writes every problem, and the table of answers a test
// client may ask for. Below them, each under a banner of its own, is the floor: what every
// other file uses beneath its own concern. Its sections (grep '^// =====' *.go):
//
//   - Errors: the codes, their statuses, and the one writer of problems
//   - Simulated answers
//   - The floor: writing a body, and JSON
//   - The floor: query parameters
//   - The floor: numbers, timestamps and instants
//   - The floor: a timeline's entries
//   - The floor: a dataset's faults and the checks of its fields
//   - The floor: reading JSON strictly
//   - The floor: record shapes
//
// Why the floor is here: the strict JSON reader, the record shapes and the checks of a
// dataset's fields are used by every file that owns a record (auth.go's accounts and keys,
// orders.go's orders, tracking.go's shipments) and by main.go, which reads a dataset, and
// request bodies are read as records too. Only a file that all of them stand above can
// hold them without an arrow running back up, and within the six files of the design card
// that is this one: a sketch that moved them up to auth.go, beside the loader, sank auth.go
// beneath orders.go and tracking.go, made it the largest file and added an arrow.
package main

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"
)

// ===== Errors: the codes, their statuses, and the one writer of problems =====

// code is an error code of the contract: every error answer carries exactly one.
type code string

const (
	codeInvalidCursor         code = "invalid_cursor"
	codeMalformedJSON         code = "malformed_json"
	codeMissingAPIKey         code = "missing_api_key"
	codeInvalidAPIKey         code = "invalid_api_key"
	codeExpiredAPIKey         code = "expired_api_key"
	codeRevokedAPIKey         code = "revoked_api_key"
	codeInsufficientScope     code = "insufficient_scope"
	codeNotFound              code = "not_found"
	codeRouteNotFound         code = "route_not_found"
	codeMethodNotAllowed      code = "method_not_allowed"
	codeBodyTooLarge          code = "body_too_large"
	codeUnknownParameter      code = "unknown_parameter"
	codeInvalidParameter      code = "invalid_parameter"
	codeRateLimited           code = "rate_limited"
	codeInternalError         code = "internal_error"
	codeProviderNotConfirmed  code = "provider_not_confirmed"
	codeLiveNotReleased       code = "live_not_released"
	codeProviderUnavailable   code = "provider_unavailable"
	codeInvalidIdempotencyKey code = "invalid_idempotency_key"
	codeOrderAlreadyLinked    code = "order_already_linked"
	codeIdempotencyKeyInUse   code = "idempotency_key_in_use"
	codeIdempotencyKeyReused  code = "idempotency_key_reused"
	codeCapabilityUnavailable code = "capability_unavailable"
	codeAmbiguousNumber       code = "ambiguous_tracking_number"
	codeExamRunning           code = "exam_running"
	codeExamGraded            code = "exam_graded"
)

// codeStatus is the one table from an error code to its HTTP status.
var codeStatus = map[code]int{
	codeInvalidCursor:         http.StatusBadRequest,
	codeMalformedJSON:         http.StatusBadRequest,
	codeMissingAPIKey:         http.StatusUnauthorized,
	codeInvalidAPIKey:         http.StatusUnauthorized,
	codeExpiredAPIKey:         http.StatusUnauthorized,
	codeRevokedAPIKey:         http.StatusUnauthorized,
	codeInsufficientScope:     http.StatusForbidden,
	codeNotFound:              http.StatusNotFound,
	codeRouteNotFound:         http.StatusNotFound,
	codeMethodNotAllowed:      http.StatusMethodNotAllowed,
	codeBodyTooLarge:          http.StatusRequestEntityTooLarge,
	codeUnknownParameter:      http.StatusUnprocessableEntity,
	codeInvalidParameter:      http.StatusUnprocessableEntity,
	codeRateLimited:           http.StatusTooManyRequests,
	codeInternalError:         http.StatusInternalServerError,
	codeProviderNotConfirmed:  http.StatusBadGateway,
	codeLiveNotReleased:       http.StatusServiceUnavailable,
	codeProviderUnavailable:   http.StatusServiceUnavailable,
	codeInvalidIdempotencyKey: http.StatusBadRequest,
	codeOrderAlreadyLinked:    http.StatusConflict,
	codeIdempotencyKeyInUse:   http.StatusConflict,
	codeIdempotencyKeyReused:  http.StatusConflict,
	codeCapabilityUnavailable: http.StatusUnprocessableEntity,
	codeAmbiguousNumber:       http.StatusConflict,
	codeExamRunning:           http.StatusConflict,
	codeExamGraded:            http.StatusConflict,
}

// apiError is an error a client is told about: its code decides the status, detail says
// what to do about it, and param, when set, names the parameter or header at fault.
type apiError struct {
	code       code
	detail     string
	param      *string
	retryAfter int // seconds the client waits before it sends the request again (Retry-After); 0: none said
}

func (e *apiError) Error() string { return string(e.code) + ": " + e.detail }

func (e *apiError) status() int { return codeStatus[e.code] }

func paramError(c code, param, detail string) *apiError {
	return &apiError{code: c, detail: detail, param: &param}
}

// bearerChallenge is what every 401 answers in WWW-Authenticate.
const bearerChallenge = `Bearer realm="sandbox"`

// The errors that do not depend on the request are made once.
var (
	errInternal = &apiError{code: codeInternalError, detail: "The sandbox failed unexpectedly. The failure is logged with this request_id."}
)

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

// writeProblem writes every error answer of the service: RFC 9457 problem details with the
// code and the request id, and param when a parameter is at fault. Every 401 carries the
// Bearer challenge (RFC 6750), whichever step answered it; headers an error needs besides
// (Allow, a 403's challenge, Retry-After) are set before. The body is appended by hand
// (BenchmarkRejected: encoding/json costs more); TestProblemBodyIsWhatEncodingJSONWrites
// holds it to what encoding/json writes of the tests' problem type.
func writeProblem(w http.ResponseWriter, requestID string, e *apiError) {
	if e.status() == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", bearerChallenge)
	}
	if e.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.retryAfter))
	}
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

// ===== Simulated answers =====

// Simulated answers: what a test client may have the sandbox answer though nothing went
// wrong, asked for with Prefer: code=... (read beside the simulate wrapper in main.go). This
// is the one table of them: the Prefer parser's message, the Retry-After rule and the
// document's checks read it.

// simulation is what answered a request instead of its route.
type simulation uint8

const (
	notSimulated simulation = iota
	byPrefer                // Prefer: code=...
	byFaults                // -faults
	byScript                // a tenant's write script (an exam's: the booking's unconfirmed creations); the journal says "exam"
)

// String is how the journal names it: "prefer", "faults", or "" for an answer of the route.
func (s simulation) String() string {
	switch s {
	case byPrefer:
		return "prefer"
	case byFaults:
		return "faults"
	case byScript:
		return "exam"
	}
	return ""
}

// simulatedAnswer is an answer a test client may ask for: the status as Prefer names it, the
// error the real API would answer with, what its detail says happened, and whether it says
// when to retry (Retry-After).
type simulatedAnswer struct {
	status     string
	code       code
	what       string
	retryAfter bool
	prefer     *apiError // the answer to Prefer: code=<status>
}

var simulatedAnswers = []*simulatedAnswer{
	simulated("429", codeRateLimited, "the rate limit is reached. Retry after the Retry-After seconds.", true),
	simulated("500", codeInternalError, "an unexpected service failure.", false),
	simulated("502", codeProviderNotConfirmed, "the provider did not confirm the operation; do not retry a booking blindly.", false),
	simulated("503", codeProviderUnavailable, "the provider is unavailable. Retry after the Retry-After seconds.", true),
}

func simulated(status string, c code, what string, retryAfter bool) *simulatedAnswer {
	return &simulatedAnswer{status: status, code: c, what: what, retryAfter: retryAfter,
		prefer: &apiError{code: c, detail: "Simulated at your request (Prefer: code=" + status + "): " + what}}
}

// simulatedAnswerOf is the answer of a status, or nil.
func simulatedAnswerOf(status string) *simulatedAnswer {
	for _, a := range simulatedAnswers {
		if a.status == status {
			return a
		}
	}
	return nil
}

// simulatedStatuses lists the statuses that may be asked for: "429, 500, 502, 503".
func simulatedStatuses() string {
	var list []string
	for _, a := range simulatedAnswers {
		list = append(list, a.status)
	}
	return strings.Join(list, ", ")
}

// ===== The floor: writing a body, and JSON =====

// What follows is not about errors: it is what every other file uses beneath its own
// concern, kept here at the ground so that every file stands above what it uses and no
// arrow between files runs back up (see the header for why this file holds it).

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
		if len(p) > 0 {
			w.Write(p)
		}
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
func appendJSONString[T string | []byte](dst []byte, s T) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c < 0x80 && c != '"' && c != '\\' {
			i++
			continue
		}
		var r rune
		size := 1
		if c >= utf8.RuneSelf {
			var rb [utf8.UTFMax]byte
			r, size = utf8.DecodeRune(rb[:copy(rb[:], s[i:])])
		}
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

// ===== The floor: query parameters =====

// A query's name=value pairs, as every operation and test helper that takes parameters reads
// them, each judged by its name, then its value.

// queryParam is one name=value pair of a query, its name decoded; a name that cannot be
// decoded is kept as sent (and is then no parameter's name).
type queryParam struct {
	name, rawValue string
}

// value is the pair's value, decoded. A literal "+" is a space, as every HTTP client and
// HTML form writes it: an offset is sent as %2B01:00 (or the instant in Z).
func (p queryParam) value() (string, error) {
	v, err := url.QueryUnescape(p.rawValue)
	if err != nil {
		return "", paramError(codeInvalidParameter, p.name, "The value of "+p.name+" is not percent-encoded correctly.")
	}
	return v, nil
}

// nextParam takes the first name=value pair off a raw query; empty pairs (a&&b) are
// skipped, and ok is false when none is left.
func nextParam(raw string) (p queryParam, rest string, ok bool) {
	var pair string
	for pair == "" {
		if raw == "" {
			return p, "", false
		}
		pair, raw, _ = strings.Cut(raw, "&")
	}
	rawName, rawValue, _ := strings.Cut(pair, "=")
	name, err := url.QueryUnescape(rawName)
	if err != nil {
		name = rawName
	}
	return queryParam{name, rawValue}, raw, true
}

func unknownParam(name, detail string) error {
	return paramError(codeUnknownParameter, name, "Unknown parameter "+strconv.Quote(name)+". "+detail)
}

// refuseParams is the query check of an operation that takes no query parameters.
func refuseParams(raw string) error {
	if p, _, ok := nextParam(raw); ok {
		return unknownParam(p.name, "This operation takes no query parameters.")
	}
	return nil
}

// ===== The floor: numbers, timestamps and instants =====

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

// The first and last instants RFC 3339 can write: the years 0000 to 9999 in UTC.
var (
	firstWritable = instantOf(time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC))
	lastWritable  = instantOf(time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC))
)

// writable reports whether RFC 3339 can write t.
func writable(t time.Time) bool {
	at := instantOf(t)
	return !firstWritable.after(at) && !at.after(lastWritable)
}

// formatTimestamp writes an instant as responses do: UTC, suffix Z, fractional seconds
// only when non-zero.
func formatTimestamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// relativeParts splits an instant of a dataset's schedule relative to the start instant:
// start, or start then + or - then an unsigned Go duration (digits, an optional fraction, a
// unit, one or more times), lower case, no spaces. It returns the sign and the duration
// ("" for start alone), or ok false. (Read by hand: a sandbox's orders are read again at
// each write, and a regular expression took a third of it.)
func relativeParts(s string) (sign byte, duration string, ok bool) {
	rest, found := strings.CutPrefix(s, "start")
	switch {
	case !found:
		return 0, "", false
	case rest == "":
		return '+', "", true
	case rest[0] != '+' && rest[0] != '-' || len(rest) == 1:
		return 0, "", false
	}
	d := rest[1:]
	for i := 0; i < len(d); {
		j := digitsFrom(d, i)
		if j == i {
			return 0, "", false
		}
		if j < len(d) && d[j] == '.' {
			if j = digitsFrom(d, j+1); d[j-1] == '.' {
				return 0, "", false
			}
		}
		u := unitAt(d[j:])
		if u == 0 {
			return 0, "", false
		}
		i = j + u
	}
	return rest[0], d, true
}

// digitsFrom is where the run of decimal digits of s from i ends.
func digitsFrom(s string, i int) int {
	for i < len(s) && '0' <= s[i] && s[i] <= '9' {
		i++
	}
	return i
}

// durationUnits are the units of a Go duration, each before any it begins.
var durationUnits = []string{"ns", "us", "µs", "μs", "ms", "s", "m", "h"}

// unitAt is the length of the duration unit s begins with, 0 for none.
func unitAt(s string) int {
	for _, u := range durationUnits {
		if strings.HasPrefix(s, u) {
			return len(u)
		}
	}
	return 0
}

// isRelative reports whether s is an instant relative to the start instant.
func isRelative(s string) bool {
	_, _, ok := relativeParts(s)
	return ok
}

var errNotInstant = errors.New("is not an instant: RFC 3339 with an offset (2026-11-01T09:30:00Z), or relative to the start instant (start, start+90s, start-10m, start+1h30m)")

// parseInstant reads an instant of a dataset's schedule: strict RFC 3339 with an offset, or
// relative to start. Instants outside the years 0000 to 9999 are refused.
func parseInstant(s string, start time.Time) (time.Time, error) {
	sign, duration, ok := relativeParts(s)
	if !ok {
		if !strings.HasPrefix(s, "start") {
			if t, err := parseTimestamp(s); err == nil || errors.Is(err, errOutOfRFC3339) {
				return t, err
			}
		}
		return time.Time{}, errNotInstant
	}
	d, err := time.ParseDuration("0s" + duration) // "" when s is start alone
	if err != nil {
		return time.Time{}, errOutOfRFC3339 // past what a duration holds: some 292 years
	}
	if sign == '-' {
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

// ===== The floor: a timeline's entries =====

// A timeline's entries: what a dataset schedules to happen, which orders.go and
// tracking.go make and auth.go merges into each tenant's timeline.

// happening is one entry of a tenant's timeline: one thing at one instant.
type happening struct {
	at     time.Time
	kind   happeningKind
	id     string // the order's or the shipment's
	status string // an order's status from then on, or the event's; "" for a shipment's creation
}

// happeningKind orders the entries of one instant.
type happeningKind uint8

const (
	shipmentCreated happeningKind = iota
	orderImported
	orderChanged
	shipmentEvent
)

// happeningKinds are the kinds as the timeline's answer names them, in their order.
var happeningKinds = [...]string{shipmentCreated: "creation", orderImported: "import", orderChanged: "change", shipmentEvent: "event"}

// what says what happens, as the page writes it: "created", "imported, unfulfilled", "now
// fulfilled", "tracking: in_transit".
func (h *happening) what() string {
	switch h.kind {
	case orderImported:
		return "imported, " + h.status
	case orderChanged:
		return "now " + h.status
	case shipmentEvent:
		return "tracking: " + h.status
	}
	return "created"
}

// ===== The floor: a dataset's faults and the checks of its fields =====

// Dataset faults. A dataset that cannot be served is refused at start with the file, the
// JSON path of the fault and the reason.

// datasetError is a fault in a dataset, or in a request body read as records.
type datasetError struct {
	file   string
	path   string
	reason string
	kind   faultKind
}

// faultKind is what a request body read as records answers for a fault of its kind.
type faultKind uint8

const (
	faultValue     faultKind = iota // 422 invalid_parameter
	faultUnknown                    // a member a record does not take: 422 unknown_parameter
	faultDuplicate                  // a member given twice, also in another case: 422 invalid_parameter at its second place
	faultLink                       // an order linked a second time: 409 order_already_linked
)

// bodyFault is the problem a request body read as records answers for a fault found reading
// or filing them: its JSON path, without the leading "$.", names the member at fault, and
// the dataset's message is the detail. The body's JSON syntax is judged before (400).
func bodyFault(err error) error {
	var de *datasetError
	if !errors.As(err, &de) {
		return err
	}
	param := strings.TrimPrefix(de.path, "$.")
	switch de.kind {
	case faultUnknown:
		return paramError(codeUnknownParameter, param, "Unknown member "+strconv.Quote(param)+": "+de.reason+".")
	case faultLink:
		return paramError(codeOrderAlreadyLinked, param, de.reason+".")
	}
	return paramError(codeInvalidParameter, param, param+": "+de.reason+".")
}

func (e *datasetError) Error() string {
	return fmt.Sprintf("dataset %s: %s: %s", e.file, e.path, e.reason)
}

// The checks of a dataset's fields. Each names the fault's path as path.name (path alone
// when name is ""), joined only when there is a fault: a million orders are checked.

// memberPath is the path of member name of the object at path.
func memberPath(path, name string) string {
	if name == "" {
		return path
	}
	return path + "." + name
}

// required refuses an empty value of a required field.
func required(path, name, value string) error {
	if value == "" {
		return &datasetError{path: memberPath(path, name), reason: "required, and must not be empty"}
	}
	return nil
}

// oneOf returns the index of a value in its vocabulary, what names, or refuses it.
func oneOf(path, name, what, value string, allowed []string) (int, error) {
	if err := required(path, name, value); err != nil {
		return 0, err
	}
	for i, a := range allowed {
		if a == value {
			return i, nil
		}
	}
	return 0, &datasetError{path: memberPath(path, name), reason: fmt.Sprintf("unknown %s %q; want one of %s", what, value, strings.Join(allowed, ", "))}
}

// maxIDBytes bounds every id, reference, key and tracking number of a dataset: a key must
// fit a header, and an order id a cursor of at most maxCursorLen.
const maxIDBytes = 255

// checkID refuses an id, reference, key or tracking number that is empty, longer than
// maxIDBytes or holds a control character (Unicode's Cc: U+0000 to U+001F and U+007F to
// U+009F). The value is UTF-8, as the dataset's reader made sure.
func checkID[T string | []byte](path, name string, value T) error {
	switch {
	case len(value) == 0:
		return &datasetError{path: memberPath(path, name), reason: "required, and must not be empty"}
	case len(value) > maxIDBytes:
		return &datasetError{path: memberPath(path, name), reason: fmt.Sprintf("is %d bytes long; at most %d", len(value), maxIDBytes)}
	}
	for i := 0; i < len(value); i++ {
		// U+0080 to U+009F are written C2 80 to C2 9F.
		if c := value[i]; c < 0x20 || c == 0x7f || c == 0xc2 && i+1 < len(value) && value[i+1] >= 0x80 && value[i+1] <= 0x9f {
			return &datasetError{path: memberPath(path, name), reason: "holds a control character"}
		}
	}
	return nil
}

// timestampField reads a dataset timestamp (not a raw event's): it must be strict RFC 3339
// with an offset, or the dataset is refused.
func timestampField(path, name, value string) (time.Time, error) {
	t, err := parseTimestamp(value)
	if err != nil {
		return time.Time{}, &datasetError{path: memberPath(path, name), reason: strconv.Quote(value) + " " + err.Error()}
	}
	return t, nil
}

// instantField reads an instant of the dataset's schedule (an order's or a shipment's):
// RFC 3339, or relative to start; anything else refuses the dataset.
func instantField(path, name, value string, start time.Time) (time.Time, error) {
	t, err := parseInstant(value, start)
	if err != nil {
		return time.Time{}, &datasetError{path: memberPath(path, name), reason: strconv.Quote(value) + " " + err.Error()}
	}
	return t, nil
}

// ===== The floor: reading JSON strictly =====

// oneJSONObject reports whether a request body is one JSON object, its strings UTF-8, nested
// at most as deep as encoding/json reads: what every body is judged by before its members.
func oneJSONObject(b []byte) bool {
	trimmed := bytes.TrimLeft(b, " \t\r\n")
	return utf8.Valid(b) && json.Valid(b) && len(trimmed) > 0 && trimmed[0] == '{'
}

// Reading a dataset: one JSON text from a stream, in one pass and strictly. Records are
// decoded by the files that own them (accounts and keys in auth.go, orders in orders.go,
// shipments in tracking.go) through a jsonReader, which judges the JSON: its syntax as
// encoding/json reads it, strings of valid UTF-8 only (encoding/json would replace what is
// not), at most maxJSONDepth nested arrays and objects, at most its limit of bytes, and a
// record's member names matched exactly, none given twice, also in another case. A fault
// names its JSON path; a syntax fault, its line and column.

// maxJSONDepth is how deeply arrays and objects may nest: encoding/json's limit.
const maxJSONDepth = 10000

// jsonReader reads a JSON text from src. What it has read but not consumed is
// buf[pos:]; base is the stream offset of buf[0].
type jsonReader struct {
	src     io.Reader
	buf     []byte
	pos     int
	base    int64
	limit   int64 // the most bytes src may hold
	ended   bool  // src has no more to give
	failed  error // what ended src early: a read error, or the limit passed
	line    int   // the line of buf[pos], from 1
	lineOff int64 // the stream offset where that line starts
	depth   int
	scratch []byte            // a string with escapes, decoded
	names   [][]byte          // per depth, the name of the member being read
	strings map[string]string // see interned
}

// readChunk is how much the reader asks its source for at a time.
const readChunk = 256 << 10

func newJSONReader(src io.Reader, limit int64) *jsonReader {
	return &jsonReader{src: src, buf: make([]byte, 0, readChunk), limit: limit, line: 1, strings: map[string]string{}}
}

// errTooLarge ends a stream that passes the reader's limit.
var errTooLarge = errors.New("too large")

// more makes n bytes from pos on available, reading src as needed, and reports whether
// they are: false at the end of src. It moves the unread bytes to the front of buf, so
// indexes into buf are good only until the next call.
func (d *jsonReader) more(n int) bool {
	for len(d.buf)-d.pos < n {
		if d.ended {
			return false
		}
		if d.pos > 0 {
			d.base += int64(d.pos)
			d.buf = d.buf[:copy(d.buf, d.buf[d.pos:])]
			d.pos = 0
		}
		if cap(d.buf)-len(d.buf) < readChunk/2 {
			d.buf = append(make([]byte, 0, 2*cap(d.buf)+readChunk), d.buf...)
		}
		k, err := d.src.Read(d.buf[len(d.buf):cap(d.buf)])
		d.buf = d.buf[:len(d.buf)+k]
		if over := d.base + int64(len(d.buf)) - d.limit; over > 0 {
			d.buf = d.buf[:len(d.buf)-int(over)]
			d.ended, d.failed = true, errTooLarge
		} else if err != nil {
			d.ended = true
			if err != io.EOF {
				d.failed = err
			}
		}
	}
	return true
}

// syntaxError is a fault of the JSON syntax at buf[pos+i].
func (d *jsonReader) syntaxError(i int, msg string) error {
	off := d.base + int64(d.pos+i)
	return &datasetError{path: "$", reason: fmt.Sprintf("invalid JSON at line %d, column %d: %s", d.line, off-d.lineOff+1, msg)}
}

// unexpected is the fault of the byte at buf[pos+i], or of the stream's end there.
func (d *jsonReader) unexpected(i int, context string) error {
	if d.pos+i < len(d.buf) {
		return d.syntaxError(i, "invalid character "+quoteChar(d.buf[d.pos+i])+" "+context)
	}
	switch {
	case d.failed == errTooLarge:
		return &datasetError{path: "$", reason: fmt.Sprintf("passes %d bytes (%s): a dataset is at most that", d.limit, byteSize(d.limit))}
	case d.failed != nil:
		return &datasetError{path: "$", reason: "reading it failed: " + d.failed.Error()}
	}
	return d.syntaxError(i, "unexpected end of file")
}

// quoteChar writes a byte as encoding/json's syntax errors do.
func quoteChar(c byte) string {
	switch c {
	case '\'':
		return `'\''`
	case '"':
		return `'"'`
	}
	s := strconv.Quote(string(rune(c)))
	if c >= utf8.RuneSelf {
		s = strconv.Quote(string([]byte{c}))
	}
	return "'" + s[1:len(s)-1] + "'"
}

// byteSize writes a size in bytes in the largest whole unit of 1024: 2 GiB.
func byteSize(n int64) string {
	units := []string{"bytes", "KiB", "MiB", "GiB"}
	u := 0
	for u < len(units)-1 && n >= 1024 && n%1024 == 0 {
		n, u = n/1024, u+1
	}
	return strconv.FormatInt(n, 10) + " " + units[u]
}

// space skips whitespace, counting lines, and returns the next byte; ok is false at the end.
func (d *jsonReader) space() (c byte, ok bool) {
	for {
		if d.pos == len(d.buf) && !d.more(1) {
			return 0, false
		}
		switch c = d.buf[d.pos]; c {
		case '\n':
			d.line++
			d.lineOff = d.base + int64(d.pos) + 1
			fallthrough
		case ' ', '\t', '\r':
			d.pos++
		default:
			return c, true
		}
	}
}

// valueTypeOf names the JSON type of a value that begins with c, as encoding/json does.
func valueTypeOf(c byte) string {
	switch c {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "bool"
	case 'n':
		return "null"
	}
	return "number"
}

// next skips whitespace to the next value and returns its first byte.
func (d *jsonReader) next() (byte, error) {
	c, ok := d.space()
	if !ok {
		return 0, d.unexpected(0, "")
	}
	return c, nil
}

// document reads the whole of src as one object: fields and member as object takes them.
// Anything after it but whitespace is a fault.
func (d *jsonReader) document(fields []string, member func(name string) error) error {
	if err := d.object("$", fields, member); err != nil {
		return err
	}
	if _, ok := d.space(); ok {
		return &datasetError{path: "$", reason: "unexpected data after the dataset object"}
	}
	if d.failed != nil {
		return d.unexpected(0, "")
	}
	return nil
}

// object reads an object at path whose members are fields: for each member, in the order
// sent, it calls member with its name (the field's own string), the reader at the value,
// which member reads. A name that is not exactly a field is unknown; a name given twice, also in
// another case (strings.EqualFold), is refused. null reads as an object without members;
// another value is refused with its type.
func (d *jsonReader) object(path string, fields []string, member func(name string) error) error {
	c, err := d.next()
	if err != nil {
		return err
	}
	if c == 'n' {
		return d.literal("null")
	}
	if c != '{' {
		if c == '[' || c == '"' || c == 't' || c == 'f' || c == '-' || '0' <= c && c <= '9' {
			return &datasetError{path: path, reason: "must be an object, not " + valueTypeOf(c)}
		}
		return d.unexpected(0, "looking for beginning of value")
	}
	var given uint64 // the fields given so far, a bit each
	err = d.members(func(name []byte) error {
		f := -1
		for g, field := range fields {
			if string(name) == field {
				f = g
			}
		}
		if f < 0 || given&(1<<f) != 0 {
			s := string(name)
			for g, field := range fields {
				if given&(1<<g) != 0 && strings.EqualFold(field, s) {
					return &datasetError{path: path + "." + s, reason: fmt.Sprintf("duplicate member: %q is given already", field), kind: faultDuplicate}
				}
			}
			return &datasetError{path: path + "." + s, reason: "unknown field", kind: faultUnknown}
		}
		given |= 1 << f
		return member(fields[f])
	})
	if err == errNotUTF8 {
		return &datasetError{path: path, reason: "a member name " + err.Error()}
	}
	return err
}

// members reads the members of an object, the reader at its '{', calling value with each
// name (d.names[depth], good until the next member), the reader at the value, which value
// reads. A name that is not UTF-8 is errNotUTF8.
func (d *jsonReader) members(value func(name []byte) error) error {
	for len(d.names) <= d.depth+1 {
		d.names = append(d.names, nil)
	}
	return d.container('}', "after object key:value pair", func(int) error {
		if c, err := d.next(); err != nil || c != '"' {
			return cmp.Or(err, d.unexpected(0, "looking for beginning of object key string"))
		}
		name, err := d.stringBytes()
		if err != nil {
			return err
		}
		name = append(d.names[d.depth][:0], name...) // reading on may move what stringBytes returned
		d.names[d.depth] = name
		if c, ok := d.space(); !ok || c != ':' {
			return d.unexpected(0, "after object key")
		}
		d.pos++
		return value(name)
	})
}

// array reads an array at path, calling elem with each element's index, the reader at the
// element, which elem reads. null reads as an empty array; another value is refused with
// its type.
func (d *jsonReader) array(path string, elem func(i int) error) error {
	c, err := d.next()
	if err != nil {
		return err
	}
	switch {
	case c == 'n':
		return d.literal("null")
	case c == '{' || c == '"' || c == 't' || c == 'f' || c == '-' || '0' <= c && c <= '9':
		return &datasetError{path: path, reason: "must be an array, not " + valueTypeOf(c)}
	case c != '[':
		return d.unexpected(0, "looking for beginning of value")
	}
	return d.container(']', "after array element", elem)
}

// container reads an array or an object, the reader at its opening byte: each item, which
// item reads, then a comma and the next, up to end. after is what a fault between two items
// says they follow.
func (d *jsonReader) container(end byte, after string, item func(i int) error) error {
	if d.depth++; d.depth > maxJSONDepth {
		return d.syntaxError(0, "exceeded max depth")
	}
	d.pos++
	c, err := d.next()
	if err != nil {
		return err
	}
	for i := 0; c != end; i++ {
		if err := item(i); err != nil {
			return err
		}
		switch c, _ = d.space(); c { // 0 at the end of the stream
		case ',':
			d.pos, c = d.pos+1, 0
		case end:
		default:
			return d.unexpected(0, after)
		}
	}
	d.pos++
	d.depth--
	return nil
}

// errNotUTF8 is a string that holds bytes that are not UTF-8; its reader names the path.
var errNotUTF8 = errors.New("holds bytes that are not UTF-8")

// stringBytes reads a string, the reader at its opening quote, and returns its content,
// decoded: good until the next read.
func (d *jsonReader) stringBytes() ([]byte, error) {
	d.pos++ // "
	for i := 0; ; {
		if d.pos+i == len(d.buf) && !d.more(i+1) {
			return nil, d.unexpected(i, "")
		}
		switch c := d.buf[d.pos+i]; {
		case c == '"':
			s := d.buf[d.pos : d.pos+i]
			d.pos += i + 1
			return s, nil
		case c == '\\':
			d.scratch = append(d.scratch[:0], d.buf[d.pos:d.pos+i]...)
			d.pos += i
			return d.escaped()
		case c < 0x20:
			return nil, d.unexpected(i, "in string literal")
		case c < utf8.RuneSelf:
			i++
		default:
			d.more(i + utf8.UTFMax)
			r, size := utf8.DecodeRune(d.buf[d.pos+i:])
			if r == utf8.RuneError && size == 1 {
				return nil, errNotUTF8
			}
			i += size
		}
	}
}

// escaped reads the rest of a string that has an escape, the reader at the first, into
// scratch: escapes are decoded as encoding/json decodes them (a lone surrogate is U+FFFD).
func (d *jsonReader) escaped() ([]byte, error) {
	for {
		if d.pos == len(d.buf) && !d.more(1) {
			return nil, d.unexpected(0, "")
		}
		switch c := d.buf[d.pos]; {
		case c == '"':
			d.pos++
			return d.scratch, nil
		case c == '\\':
			r, err := d.escape()
			if err != nil {
				return nil, err
			}
			d.scratch = utf8.AppendRune(d.scratch, r)
		case c < 0x20:
			return nil, d.unexpected(0, "in string literal")
		case c < utf8.RuneSelf:
			d.scratch = append(d.scratch, c)
			d.pos++
		default:
			d.more(utf8.UTFMax)
			r, size := utf8.DecodeRune(d.buf[d.pos:])
			if r == utf8.RuneError && size == 1 {
				return nil, errNotUTF8
			}
			d.scratch = append(d.scratch, d.buf[d.pos:d.pos+size]...)
			d.pos += size
		}
	}
}

// escape reads one escape, the reader at its backslash, and returns the rune it stands
// for: a \u escape of a surrogate pair is read with its second half.
func (d *jsonReader) escape() (rune, error) {
	if !d.more(2) {
		return 0, d.unexpected(1, "")
	}
	var r rune
	switch d.buf[d.pos+1] {
	case '"', '\\', '/':
		r = rune(d.buf[d.pos+1])
	case 'b':
		r = '\b'
	case 'f':
		r = '\f'
	case 'n':
		r = '\n'
	case 'r':
		r = '\r'
	case 't':
		r = '\t'
	case 'u':
		return d.unicodeEscape()
	default:
		return 0, d.unexpected(1, "in string escape code")
	}
	d.pos += 2
	return r, nil
}

// unicodeEscape reads a \u escape, the reader at its backslash.
func (d *jsonReader) unicodeEscape() (rune, error) {
	r, err := d.hex4(2)
	if err != nil {
		return 0, err
	}
	d.pos += 6
	if !utf16.IsSurrogate(r) {
		return r, nil
	}
	if d.more(6) && d.buf[d.pos] == '\\' && d.buf[d.pos+1] == 'u' {
		if r2, err := d.hex4(2); err == nil {
			if pair := utf16.DecodeRune(r, r2); pair != utf8.RuneError {
				d.pos += 6
				return pair, nil
			}
		}
	}
	return utf8.RuneError, nil
}

// hex4 reads the four hexadecimal digits of a \u escape at buf[pos+i:].
func (d *jsonReader) hex4(i int) (rune, error) {
	var r rune
	for k := range 4 {
		if !d.more(i + k + 1) {
			return 0, d.unexpected(i+k, "")
		}
		c := d.buf[d.pos+i+k]
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, d.unexpected(i+k, `in \u hexadecimal character escape`)
		}
		r = r<<4 | rune(c)
	}
	return r, nil
}

// literal reads the literal word (true, false or null), the reader at its first byte.
func (d *jsonReader) literal(word string) error {
	for i := 1; i < len(word); i++ {
		if !d.more(i+1) || d.buf[d.pos+i] != word[i] {
			return d.unexpected(i, fmt.Sprintf("in literal %s (expecting %s)", word, quoteChar(word[i])))
		}
	}
	d.pos += len(word)
	return nil
}

// number reads a number, the reader at its first byte, as RFC 8259 writes one.
func (d *jsonReader) number() ([]byte, error) {
	i := 0
	at := func() byte {
		if !d.more(i + 1) {
			return 0
		}
		return d.buf[d.pos+i]
	}
	digits := func() int {
		n := 0
		for c := at(); '0' <= c && c <= '9'; c = at() {
			i, n = i+1, n+1
		}
		return n
	}
	if at() == '-' {
		i++
	}
	if c := at(); c == '0' {
		i++
	} else if digits() == 0 {
		return nil, d.unexpected(i, "in numeric literal")
	}
	if at() == '.' {
		i++
		if digits() == 0 {
			return nil, d.unexpected(i, "after decimal point in numeric literal")
		}
	}
	if c := at(); c == 'e' || c == 'E' {
		i++
		if c := at(); c == '+' || c == '-' {
			i++
		}
		if digits() == 0 {
			return nil, d.unexpected(i, "in exponent of numeric literal")
		}
	}
	d.pos += i
	return d.buf[d.pos-i : d.pos], nil
}

// skip reads any value at path and keeps nothing of it: the opaque payload of an order.
// Its strings must be UTF-8 too; a fault inside it names its path within.
func (d *jsonReader) skip(path string) error {
	err := d.skipValue()
	if f, ok := err.(*utf8Fault); ok {
		return &datasetError{path: path + f.where, reason: f.what + errNotUTF8.Error()}
	}
	return err
}

// utf8Fault is a string inside a skipped value that is not UTF-8: where is its path
// within the value, made as the reader returns from it.
type utf8Fault struct{ where, what string }

func (f *utf8Fault) Error() string { return f.where + ": " + f.what + errNotUTF8.Error() }

// skipValue reads any value and keeps nothing of it.
func (d *jsonReader) skipValue() error {
	c, err := d.next()
	if err != nil {
		return err
	}
	switch {
	case c == '{':
		err := d.members(func(name []byte) error {
			err := d.skipValue()
			if f, ok := err.(*utf8Fault); ok {
				f.where = "." + string(name) + f.where
			}
			return err
		})
		if err == errNotUTF8 {
			return &utf8Fault{what: "a member name "}
		}
		return err
	case c == '[':
		return d.container(']', "after array element", func(i int) error {
			err := d.skipValue()
			if f, ok := err.(*utf8Fault); ok {
				f.where = "[" + strconv.Itoa(i) + "]" + f.where
			}
			return err
		})
	case c == '"':
		if _, err := d.stringBytes(); err == errNotUTF8 {
			return &utf8Fault{}
		} else if err != nil {
			return err
		}
		return nil
	case c == 't':
		return d.literal("true")
	case c == 'f':
		return d.literal("false")
	case c == 'n':
		return d.literal("null")
	case c == '-' || '0' <= c && c <= '9':
		_, err := d.number()
		return err
	}
	return d.unexpected(0, "looking for beginning of value")
}

// value reads up to a value that must be of the type kind names, unless it is null, the
// reader at it: it returns its first byte (0 for null, which it reads), or refuses another
// type at path.name. kind is "a string" (want '"') or "true or false" (want 't').
func (d *jsonReader) value(path, name string, want byte, kind string) (byte, error) {
	c, err := d.next()
	if err != nil {
		return 0, err
	}
	switch {
	case c == 'n':
		return 0, d.literal("null")
	case c == want || want == 't' && c == 'f':
		return c, nil
	case c == '{' || c == '[' || c == '"' || c == 't' || c == 'f' || c == '-' || '0' <= c && c <= '9':
		return 0, &datasetError{path: path + "." + name, reason: "must be " + kind + ", not " + valueTypeOf(c)}
	}
	return 0, d.unexpected(0, "looking for beginning of value")
}

// interned is str for a value that repeats across records (an account, a status): one
// string is kept for each, up to maxInterned short ones, rather than one per record.
func (d *jsonReader) interned(path, name string) (string, error) {
	b, err := d.strBytes(path, name)
	if s, ok := d.strings[string(b)]; ok || err != nil {
		return s, err
	}
	s := string(b)
	if len(d.strings) < maxInterned && len(s) <= 64 {
		d.strings[s] = s
	}
	return s, nil
}

const maxInterned = 4096

// str reads the string member name of the object at path: null reads as "".
func (d *jsonReader) str(path, name string) (string, error) {
	b, err := d.strBytes(path, name)
	return string(b), err
}

// strBytes is str, good until the next read.
func (d *jsonReader) strBytes(path, name string) ([]byte, error) {
	c, err := d.value(path, name, '"', "a string")
	if c == 0 || err != nil {
		return nil, err
	}
	return d.memberString(path, name)
}

// memberString reads the string of member name, the reader at its opening quote.
func (d *jsonReader) memberString(path, name string) ([]byte, error) {
	b, err := d.stringBytes()
	if err == errNotUTF8 {
		return nil, &datasetError{path: path + "." + name, reason: err.Error()}
	}
	return b, err
}

// optStr reads a string member that may be null (nil).
func (d *jsonReader) optStr(path, name string) (*string, error) {
	c, err := d.value(path, name, '"', "a string")
	if c == 0 || err != nil {
		return nil, err
	}
	b, err := d.memberString(path, name)
	s := string(b)
	return &s, err
}

// boolean reads a member that is true or false: null reads as false.
func (d *jsonReader) boolean(path, name string) (bool, error) {
	c, err := d.value(path, name, 't', "true or false")
	if c == 0 || err != nil {
		return false, err
	}
	if c == 't' {
		return true, d.literal("true")
	}
	return false, d.literal("false")
}

// strs reads a member that is an array of strings: null reads as none.
func (d *jsonReader) strs(path, name string) ([]string, error) {
	var list []string
	err := d.array(path+"."+name, func(i int) error {
		s, err := d.str(path, name+"["+strconv.Itoa(i)+"]")
		list = append(list, s)
		return err
	})
	return list, err
}

// whole reads a member that must be a whole number written in digits, without a sign, a
// fraction or an exponent, up to most; any other value (null included) is refused at
// path.name.
func (d *jsonReader) whole(path, name string, most int) (int, error) {
	c, err := d.next()
	if err != nil {
		return 0, err
	}
	fault := &datasetError{path: path + "." + name, reason: fmt.Sprintf("must be a whole number from 0 to %d", most)}
	if c < '0' || c > '9' {
		if err := d.skipValue(); err != nil {
			return 0, err
		}
		return 0, fault
	}
	text, err := d.number()
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(string(text))
	if err != nil || n > most {
		return 0, fault
	}
	return n, nil
}

// scalar reads a member whose JSON type the caller judges: a string (its text), null (not
// given), or any other value (given, not a string).
func (d *jsonReader) scalar(path, name string) (jsonScalar, error) {
	c, err := d.next()
	switch {
	case err != nil:
		return jsonScalar{}, err
	case c == 'n':
		return jsonScalar{}, d.literal("null")
	case c == '"':
		b, err := d.memberString(path, name)
		return jsonScalar{given: true, isString: true, text: string(b)}, err
	}
	return jsonScalar{given: true}, d.skip(path + "." + name)
}

// jsonScalar is a member's value where its JSON type decides what it means.
type jsonScalar struct {
	given    bool // present and not null
	isString bool
	text     string // when a string
}

// ===== The floor: record shapes =====

// A record's members: each record type lists its own, and how each is read into a record,
// in a recordShape; read reads an object of them, names matched exactly, none given twice.

// member is one member of a record of type T: its name, and how its value is read into rec.
type member[T any] struct {
	name string
	read func(d *jsonReader, path, name string, rec *T) error
}

// recordShape is a record type's members, with their names as object matches them.
type recordShape[T any] struct {
	names   []string
	members []member[T]
}

func shapeOf[T any](members ...member[T]) recordShape[T] {
	sh := recordShape[T]{members: members}
	for _, m := range members {
		sh.names = append(sh.names, m.name)
	}
	return sh
}

// without is the shape but for the members named: a record sent in a request body names no
// owner, nor what the request itself decides.
func (sh recordShape[T]) without(names ...string) recordShape[T] {
	var kept []member[T]
	for _, m := range sh.members {
		if !slices.Contains(names, m.name) {
			kept = append(kept, m)
		}
	}
	return shapeOf(kept...)
}

// read reads the object at path into rec.
func (sh *recordShape[T]) read(d *jsonReader, path string, rec *T) error {
	return d.object(path, sh.names, func(name string) error { return sh.member(d, path, name, rec) })
}

// member reads the value of the member name of the object at path into rec.
func (sh *recordShape[T]) member(d *jsonReader, path, name string, rec *T) error {
	for _, m := range sh.members {
		if m.name == name {
			return m.read(d, path, name, rec)
		}
	}
	return nil // object passes only names of sh
}

// The kinds of member, each a reader of the JSON value into the field that field points to.

// into is the member name read by read into the field of a record that field points to.
func into[T, V any](name string, field func(*T) *V, read func(d *jsonReader, path, name string) (V, error)) member[T] {
	return member[T]{name, func(d *jsonReader, path, name string, rec *T) (err error) {
		*field(rec), err = read(d, path, name)
		return err
	}}
}

// text is a string; null reads as "".
func text[T any](name string, field func(*T) *string) member[T] {
	return into(name, field, (*jsonReader).str)
}

// shared is a string that repeats across records (an account, a status): kept once.
func shared[T any](name string, field func(*T) *string) member[T] {
	return into(name, field, (*jsonReader).interned)
}

// optional is a string or null (nil).
func optional[T any](name string, field func(*T) **string) member[T] {
	return into(name, field, (*jsonReader).optStr)
}

// texts is an array of strings; null reads as none.
func texts[T any](name string, field func(*T) *[]string) member[T] {
	return into(name, field, (*jsonReader).strs)
}

// truth is true or false; null reads as false.
func truth[T any](name string, field func(*T) *bool) member[T] {
	return into(name, field, (*jsonReader).boolean)
}

// anyScalar is a value whose JSON type the record judges (see jsonScalar).
func anyScalar[T any](name string, field func(*T) *jsonScalar) member[T] {
	return into(name, field, (*jsonReader).scalar)
}

// records is an array of records of type E, each decoded by its type.
func records[T, E any, P interface {
	*E
	decode(d *jsonReader, path string) error
}](name string, field func(*T) *[]E) member[T] {
	return member[T]{name, func(d *jsonReader, path, name string, rec *T) error {
		return readList[E, P](d, path+"."+name, field(rec))
	}}
}

// readShaped reads the array at path, each element a record of shape: a record a request
// body sends, whose shape is its type's but for what the request decides.
func readShaped[T any](d *jsonReader, path string, shape *recordShape[T], list *[]T) error {
	return d.array(path, func(i int) error {
		var rec T
		err := shape.read(d, path+"["+strconv.Itoa(i)+"]", &rec)
		*list = append(*list, rec)
		return err
	})
}

// readList reads the array at path, each element a record that its type decodes.
func readList[T any, P interface {
	*T
	decode(d *jsonReader, path string) error
}](d *jsonReader, path string, list *[]T) error {
	return d.array(path, func(i int) error {
		var rec T
		err := P(&rec).decode(d, path+"["+strconv.Itoa(i)+"]")
		*list = append(*list, rec)
		return err
	})
}
