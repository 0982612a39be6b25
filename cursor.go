// cursor.go is the signed next_cursor of order lists: what it binds (tenant, filters,
// position), how it is signed and how a cursor sent back is verified. One section:
//
//   - Cursors
package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"time"
)

// ===== Cursors =====

// A next_cursor is base64url (no padding) of
//
//	version (1) | tenant tag (8) | filter tag (8) | created_at seconds (8) | nanoseconds (4) | order id | HMAC-SHA256 (32)
//
// The position is the last order of the page: the next page starts after it. The tags bind
// the cursor to the account and environment and to the filters it was issued for (not to
// the limit, which may change between pages); the HMAC, keyed with -cursor-secret, makes
// any other cursor, altered or made elsewhere, fail to verify.

const (
	cursorVersion   = 1
	cursorHeaderLen = 1 + 8 + 8 + 8 + 4
	// maxCursorLen is the longest cursor accepted: that of the longest id.
	maxCursorLen = (cursorHeaderLen + maxIDBytes + sha256.Size + 2) / 3 * 4
)

// strictBase64 refuses padding and non-zero trailing bits, so that each cursor has exactly
// one spelling and changing any character of it changes the bytes it decodes to.
var strictBase64 = base64.RawURLEncoding.Strict()

// tag is a short digest that binds a cursor to something it must be used with.
type tag [8]byte

// tagOf digests its parts, each followed by a zero byte, into a tag.
func tagOf(parts ...string) tag {
	var buf [64]byte
	b := buf[:0]
	for _, p := range parts {
		b = append(append(b, p...), 0)
	}
	sum := sha256.Sum256(b)
	return tag(sum[:8])
}

// cursorPosition is where a page ended: the (created_at, id) of its last order.
type cursorPosition struct {
	createdAt time.Time
	id        string
}

// cursorSigner issues and verifies cursors with one secret; one without (exam regrade's,
// which judges a trace's cursors without the secret of the process that signed them) takes
// a cursor's position as written.
type cursorSigner struct {
	key []byte
}

func newCursorSigner(secret []byte) *cursorSigner {
	return &cursorSigner{key: append([]byte(nil), secret...)}
}

// mac is the HMAC of body.
func (c *cursorSigner) mac(body []byte) []byte {
	h := hmac.New(sha256.New, c.key)
	h.Write(body)
	return h.Sum(nil)
}

// appendSigned appends the cursor for the page that ends at the order created at createdAt
// with this id to dst.
func (c *cursorSigner) appendSigned(dst []byte, owner, filters tag, createdAt time.Time, id []byte) []byte {
	b := make([]byte, 0, cursorHeaderLen+len(id)+sha256.Size)
	b = append(b, cursorVersion)
	b = append(b, owner[:]...)
	b = append(b, filters[:]...)
	b = binary.BigEndian.AppendUint64(b, uint64(createdAt.Unix()))
	b = binary.BigEndian.AppendUint32(b, uint32(createdAt.Nanosecond()))
	b = append(b, id...)
	b = append(b, c.mac(b)...)
	return strictBase64.AppendEncode(dst, b)
}

var (
	errCursorMalformed = paramError(codeInvalidCursor, "cursor", "The cursor is not a next_cursor of this API. Pass next_cursor from the previous page unchanged.")
	errCursorForged    = paramError(codeInvalidCursor, "cursor", "The cursor was not issued by this sandbox or was altered. Cursors do not survive a restart unless -cursor-secret is set.")
	errCursorTenant    = paramError(codeInvalidCursor, "cursor", "The cursor was issued to another account or environment.")
)

// verify returns the position a cursor holds and the filters it was issued for if this
// signer issued it for the tenant owner (a tag); whether its filters are the page's is the
// list's to judge.
func (c *cursorSigner) verify(s string, owner tag) (cursorPosition, tag, error) {
	if len(s) > maxCursorLen || !isBase64URL(s) {
		return cursorPosition{}, tag{}, errCursorMalformed
	}
	b, err := strictBase64.DecodeString(s)
	if err != nil || len(b) < cursorHeaderLen+1+sha256.Size || b[0] != cursorVersion {
		return cursorPosition{}, tag{}, errCursorMalformed
	}
	body, mac := b[:len(b)-sha256.Size], b[len(b)-sha256.Size:]
	if c.key != nil && !hmac.Equal(mac, c.mac(body)) {
		return cursorPosition{}, tag{}, errCursorForged
	}
	if tag(body[1:9]) != owner {
		return cursorPosition{}, tag{}, errCursorTenant
	}
	nsec := binary.BigEndian.Uint32(body[25:29])
	if nsec >= uint32(time.Second) {
		return cursorPosition{}, tag{}, errCursorMalformed
	}
	sec := int64(binary.BigEndian.Uint64(body[17:25]))
	return cursorPosition{createdAt: time.Unix(sec, int64(nsec)).UTC(), id: string(body[cursorHeaderLen:])}, tag(body[9:17]), nil
}

// isBase64URL reports whether s holds only the base64url alphabet: the decoder itself
// skips \r and \n, which would let an altered spelling of a cursor pass.
func isBase64URL(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}
