package respcoord

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"unicode/utf8"
)

// The id limits of the wire contract, in UTF-8 bytes (rules.json "ids").
const (
	MaxSessionIDBytes = 256
	MaxRequestIDBytes = 128
)

// ValidateSessionID refuses, as an *Error with code INVALID_ARGUMENT naming
// session_id, a session id the coordinator would refuse: 1 to 256 bytes of
// UTF-8 with no Unicode Cc character (U+0000-U+001F, U+007F-U+009F). Checking
// before sending turns a programming error into an answer without a round trip.
func ValidateSessionID(id string) error {
	if id == "" {
		return invalidArgument("session_id", "must not be empty")
	}
	if len(id) > MaxSessionIDBytes {
		return invalidArgument("session_id", fmt.Sprintf("is %d bytes, longer than the limit of %d", len(id), MaxSessionIDBytes))
	}
	if !utf8.ValidString(id) {
		return invalidArgument("session_id", "must be valid UTF-8")
	}
	for _, r := range id {
		if r < 0x20 || (r >= 0x7f && r <= 0x9f) {
			return invalidArgument("session_id", fmt.Sprintf("contains the control character U+%04X", r))
		}
	}
	return nil
}

// ValidateRequestID refuses a caller-given request id the coordinator would
// refuse (more than 128 bytes), and an empty one: every Start this client
// sends carries a request id, generated when the caller gives none, so an
// empty one is a mistake, not a request for none.
func ValidateRequestID(id string) error {
	if id == "" {
		return invalidArgument("request_id", "must not be empty (give none to have one generated)")
	}
	if len(id) > MaxRequestIDBytes {
		return invalidArgument("request_id", fmt.Sprintf("is %d bytes, longer than the limit of %d", len(id), MaxRequestIDBytes))
	}
	return nil
}

// NewRequestID is a fresh request id: "rc-" and 128 random bits in hex. A
// Start given none gets one, which makes that call's own retries replay-safe.
func NewRequestID() string {
	var b [16]byte
	// crypto/rand.Read never fails (Go 1.24+: it panics rather than return short).
	_, _ = rand.Read(b[:])
	return "rc-" + hex.EncodeToString(b[:])
}
