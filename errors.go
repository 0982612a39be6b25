package main

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Error codes of the contract. Every error response carries exactly one of them.
const (
	codeInvalidCursor        = "invalid_cursor"
	codeMissingAPIKey        = "missing_api_key"
	codeInvalidAPIKey        = "invalid_api_key"
	codeExpiredAPIKey        = "expired_api_key"
	codeRevokedAPIKey        = "revoked_api_key"
	codeInsufficientScope    = "insufficient_scope"
	codeNotFound             = "not_found"
	codeRouteNotFound        = "route_not_found"
	codeMethodNotAllowed     = "method_not_allowed"
	codeBodyTooLarge         = "body_too_large"
	codeUnknownParameter     = "unknown_parameter"
	codeInvalidParameter     = "invalid_parameter"
	codeRateLimited          = "rate_limited"
	codeInternalError        = "internal_error"
	codeProviderNotConfirmed = "provider_not_confirmed"
	codeLiveNotReleased      = "live_not_released"
	codeProviderUnavailable  = "provider_unavailable"
)

// statusOf is the one mapping from an error code to its HTTP status. A code it does not
// know is a programming error and answers as an internal error.
func statusOf(code string) int {
	switch code {
	case codeInvalidCursor:
		return http.StatusBadRequest
	case codeMissingAPIKey, codeInvalidAPIKey, codeExpiredAPIKey, codeRevokedAPIKey:
		return http.StatusUnauthorized
	case codeInsufficientScope:
		return http.StatusForbidden
	case codeNotFound, codeRouteNotFound:
		return http.StatusNotFound
	case codeMethodNotAllowed:
		return http.StatusMethodNotAllowed
	case codeBodyTooLarge:
		return http.StatusRequestEntityTooLarge
	case codeUnknownParameter, codeInvalidParameter:
		return http.StatusUnprocessableEntity
	case codeRateLimited:
		return http.StatusTooManyRequests
	case codeProviderNotConfirmed:
		return http.StatusBadGateway
	case codeLiveNotReleased, codeProviderUnavailable:
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}

// apiError is an error a client is told about: its code decides the status, detail says
// what to do about it, and param names the query parameter or header at fault.
type apiError struct {
	code     string
	detail   string
	param    string
	hasParam bool // param is named in the body, even when empty (a query "?=1")
}

func (e *apiError) Error() string { return e.code + ": " + e.detail }

func paramError(code, param, detail string) *apiError {
	return &apiError{code: code, detail: detail, param: param, hasParam: true}
}

// The errors that do not depend on the request are made once.
var (
	errRouteNotFound    = &apiError{code: codeRouteNotFound, detail: "No operation is served at this path. The operations are under /v1; see /v1/openapi.json."}
	errMethodNotAllowed = &apiError{code: codeMethodNotAllowed, detail: "This path answers GET and HEAD only."}
	errBodyTooLarge     = &apiError{code: codeBodyTooLarge, detail: "The request body exceeds 262144 bytes (256 KiB)."}
	errInternal         = &apiError{code: codeInternalError, detail: "The sandbox failed unexpectedly. The failure is logged with this request_id."}
)

// problemBufs holds the buffers error bodies and list pages are assembled in.
var problemBufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// writeError writes every error response of the service: RFC 9457 problem details with the
// contract's code and the request id. Headers an error needs besides (Allow,
// WWW-Authenticate, Retry-After) are set by the caller before.
func writeError(w http.ResponseWriter, e *apiError) {
	status := statusOf(e.code)
	bp := problemBufs.Get().(*[]byte)
	b := append((*bp)[:0], `{"type":"about:blank","title":`...)
	b = appendJSONString(b, http.StatusText(status))
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, `,"detail":`...)
	b = appendJSONString(b, e.detail)
	b = append(b, `,"code":`...)
	b = appendJSONString(b, e.code)
	if e.hasParam {
		b = append(b, `,"param":`...)
		b = appendJSONString(b, e.param)
	}
	b = append(b, `,"request_id":`...)
	b = appendJSONString(b, exchangeOf(w).id)
	b = append(b, '}')
	writeBody(w, status, problemContentType, b)
	*bp = b
	problemBufs.Put(bp)
}

// appendJSONString appends s as a JSON string exactly as encoding/json writes it with HTML
// escaping off (and as slog's JSONHandler does): bytes that are not UTF-8 become U+FFFD,
// U+2028 and U+2029 are escaped, so that odd input echoed in a body or log line never
// breaks it.
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < 0x80 {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 || r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			switch r {
			case '\u2028':
				dst = append(dst, `\u2028`...)
			case '\u2029':
				dst = append(dst, `\u2029`...)
			default:
				dst = append(dst, `\ufffd`...)
			}
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// Simulated answers: a test-environment client may ask, with the RFC 7240 Prefer header,
// for an answer the sandbox never gives on its own (code=429|500|502|503) and/or for a
// delay (delay=MS), to rehearse how its integration copes.

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
	code    string // "" or a key of simulatedCodes
	delay   time.Duration
	applied string // the Preference-Applied value, "" when nothing is applied
}

// parsePrefer reads the Prefer header fields (RFC 7240, section 2): comma-separated
// preferences, each a token with an optional value (token or quoted string) and optional
// parameters after ";". Names are case-insensitive; the first instance of a preference
// counts; preferences other than code and delay are ignored, as the RFC says.
func parsePrefer(fields []string) (preference, *apiError) {
	var p preference
	var seenCode, seenDelay bool
	var applied []string
	for _, field := range fields {
		for _, item := range splitOutsideQuotes(field, ',') {
			name, value, _ := strings.Cut(strings.TrimSpace(splitOutsideQuotes(item, ';')[0]), "=")
			name, value = strings.TrimSpace(name), unquote(strings.TrimSpace(value))
			switch {
			case strings.EqualFold(name, "code") && !seenCode:
				seenCode = true
				if simulatedCodes[value] == nil {
					return p, paramError(codeInvalidParameter, "Prefer", "Prefer code must be one of 429, 500, 502, 503.")
				}
				p.code = value
				applied = append(applied, "code="+value)
			case strings.EqualFold(name, "delay") && !seenDelay:
				seenDelay = true
				ms, ok := parseDigits(value, 5)
				if !ok || ms > int(maxPreferDelay/time.Millisecond) {
					return p, paramError(codeInvalidParameter, "Prefer", "Prefer delay must be a whole number of milliseconds from 0 to 10000.")
				}
				p.delay = time.Duration(ms) * time.Millisecond
				applied = append(applied, "delay="+strconv.Itoa(ms))
			}
		}
	}
	p.applied = strings.Join(applied, ", ")
	return p, nil
}

// splitOutsideQuotes splits s at sep, except inside a quoted string.
func splitOutsideQuotes(s string, sep byte) []string {
	var parts []string
	quoted, start := false, 0
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\' && quoted:
			i++
		case s[i] == '"':
			quoted = !quoted
		case s[i] == sep && !quoted:
			parts = append(parts, s[start:i])
			start = i + 1
		}
	}
	return append(parts, s[start:])
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

// simulate applies a test client's Prefer header. It runs right after the scope check, so
// a live key, a missing or bad key, a rate-limited key and a key without the scope get
// exactly what they would get without the header, and a simulated answer shows no data.
func (s *server) simulate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fields := r.Header["Prefer"]
		if len(fields) == 0 {
			next.ServeHTTP(w, r)
			return
		}
		p, perr := parsePrefer(fields)
		if perr != nil {
			writeError(w, perr)
			return
		}
		if p.applied != "" {
			w.Header()["Preference-Applied"] = []string{p.applied}
		}
		if p.delay > 0 {
			t := time.NewTimer(p.delay)
			select {
			case <-t.C:
			case <-s.stopping:
				// The server is shutting down: answer now, so that draining is not held up.
				t.Stop()
			case <-r.Context().Done():
				t.Stop()
				exchangeOf(w).status = statusClientClosedRequest
				return
			}
		}
		if e := simulatedCodes[p.code]; e != nil {
			if e.code == codeRateLimited || e.code == codeProviderUnavailable {
				w.Header()["Retry-After"] = retryAfterOneSecond
			}
			writeError(w, e)
			return
		}
		next.ServeHTTP(w, r)
	})
}
