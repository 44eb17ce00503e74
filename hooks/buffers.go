package hooks

import (
	"bytes"
	gosync "sync"

	"github.com/go-json-experiment/json/jsontext"
)

// bufferPool keeps buffers of one use from one request to the next. Uses get pools of their
// own: a buffer that has grown to what one use needs (a body of tens of KB) would otherwise
// be handed to another (a string of a few) while the first use is given a small one to grow.
type bufferPool struct{ pool gosync.Pool }

// maxPooledBuffer: a buffer grown by an unusually large request is left to the GC, so a pool
// keeps only what typical requests need.
const maxPooledBuffer = 1 << 20

func (p *bufferPool) get() *bytes.Buffer {
	if b, ok := p.pool.Get().(*bytes.Buffer); ok {
		return b
	}
	return new(bytes.Buffer)
}

func (p *bufferPool) put(b *bytes.Buffer) {
	if b.Cap() <= maxPooledBuffer {
		b.Reset()
		p.pool.Put(b)
	}
}

// bodies hold request bodies and answers: the decoder parses straight from a body's
// buffer, and an answer is encoded into one before its status is sent.
var bodies bufferPool

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
