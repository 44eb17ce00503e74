package hooks

import (
	"bytes"
	gosync "sync"
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
