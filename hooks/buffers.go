package hooks

import (
	"bytes"
	gosync "sync"

	"github.com/go-json-experiment/json/jsontext"
)

// buffers hold request bodies and answers from one request to the next: the decoder parses
// straight from a body's buffer, and an answer is encoded into one before its status is sent.
var buffers = gosync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxPooledBuffer: a buffer grown by an unusually large request is left to the GC, so the
// pool keeps only what typical requests need.
const maxPooledBuffer = 1 << 20

func getBuffer() *bytes.Buffer { return buffers.Get().(*bytes.Buffer) }

func putBuffer(b *bytes.Buffer) {
	if b.Cap() <= maxPooledBuffer {
		b.Reset()
		buffers.Put(b)
	}
}

// decoders keep, from one request to the next, the state a decoder grows while it reads a
// body: the names of every object it is in (kept to refuse a name given twice) and its token
// stacks.
var decoders = gosync.Pool{New: func() any { return new(jsontext.Decoder) }}

// getDecoder returns a decoder reading body with decodeOptions.
func getDecoder(body *bytes.Buffer) *jsontext.Decoder {
	dec := decoders.Get().(*jsontext.Decoder)
	dec.Reset(body, decodeOptions...)
	return dec
}

// putDecoder returns a decoder once reading has returned; one left mid-value by a panic is
// not put back, and the next Reset starts every other one afresh.
func putDecoder(dec *jsontext.Decoder) { decoders.Put(dec) }
