package membership

import (
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// answerProxy forwards a loopback port to one member's client port and, when armed, loses or
// holds the answer to one gRPC call. It reads the HTTP/2 frames both ways and learns each
// request's method from its headers; it acts on the first HEADERS or DATA frame the server
// sends on that call's stream, which etcd sends only once the call is finished (a membership
// change applied), so losing an answer never depends on timing.
type answerProxy struct {
	t      testing.TB
	l      net.Listener
	target string
	closed chan struct{}

	mu    sync.Mutex
	trap  *trap
	conns map[net.Conn]bool
}

// trap is one armed call: skip matching calls pass first; the next one is caught.
type trap struct {
	method string
	skip   int
	// release, when set, holds the answer until it is closed; nil loses it.
	release chan struct{}
	// caught is closed once the server has answered the caught call.
	caught chan struct{}
}

// newAnswerProxy listens on a free loopback port for target (host:port) until the test ends.
func newAnswerProxy(t testing.TB, target string) *answerProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &answerProxy{t: t, l: l, target: target, closed: make(chan struct{}), conns: map[net.Conn]bool{}}
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *answerProxy) addr() string { return p.l.Addr().String() }

// lose arms the proxy: the answer to the call of method after skip others is lost, the
// client's connection closed under it. The channel is closed once that happened.
func (p *answerProxy) lose(method string, skip int) <-chan struct{} {
	return p.arm(&trap{method: method, skip: skip, caught: make(chan struct{})})
}

// hold arms the proxy: the answer to the next call of method waits until release is called.
// The channel is closed once the answer is held.
func (p *answerProxy) hold(method string) (caught <-chan struct{}, release func()) {
	tr := &trap{method: method, release: make(chan struct{}), caught: make(chan struct{})}
	return p.arm(tr), sync.OnceFunc(func() { close(tr.release) })
}

func (p *answerProxy) arm(tr *trap) <-chan struct{} {
	p.mu.Lock()
	p.trap = tr
	p.mu.Unlock()
	return tr.caught
}

// claim hands the trap to a request for method, once.
func (p *answerProxy) claim(method string) *trap {
	p.mu.Lock()
	defer p.mu.Unlock()
	tr := p.trap
	if tr == nil || tr.method != method {
		return nil
	}
	if tr.skip > 0 {
		tr.skip--
		return nil
	}
	p.trap = nil
	return tr
}

func (p *answerProxy) close() {
	p.l.Close()
	p.mu.Lock()
	close(p.closed)
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
}

// track registers c for closing with the proxy; false when the proxy is closed already.
func (p *answerProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.closed:
		c.Close()
		return false
	default:
	}
	p.conns[c] = true
	return true
}

func (p *answerProxy) accept() {
	for {
		client, err := p.l.Accept()
		if err != nil {
			return
		}
		go p.pipe(client)
	}
}

// caughtStream is the stream of one connection whose answer a trap waits for.
type caughtStream struct {
	mu     sync.Mutex
	stream uint32
	trap   *trap
}

func (p *answerProxy) pipe(client net.Conn) {
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		client.Close()
		return
	}
	if !p.track(client) || !p.track(server) {
		client.Close()
		server.Close()
		return
	}
	var cs caughtStream
	closeBoth := sync.OnceFunc(func() { client.Close(); server.Close() })
	go func() {
		defer closeBoth()
		p.requests(client, server, &cs)
	}()
	defer closeBoth()
	p.answers(server, client, &cs)
}

// requests forwards the client's frames, after claiming the trap for the stream whose
// headers name its method, so that the claim is in place before the server can answer.
func (p *answerProxy) requests(client, server net.Conn, cs *caughtStream) {
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(client, preface); err != nil {
		return
	}
	if _, err := server.Write(preface); err != nil {
		return
	}
	dec := hpack.NewDecoder(4096, nil)
	var block []byte
	for {
		frame, err := readFrame(client)
		if err != nil {
			return
		}
		typ, flags, stream, payload := http2.FrameType(frame[3]), http2.Flags(frame[4]), binary.BigEndian.Uint32(frame[5:9])&(1<<31-1), frame[9:]
		switch typ {
		case http2.FrameHeaders:
			if flags.Has(http2.FlagHeadersPadded) {
				payload = payload[1 : len(payload)-int(payload[0])]
			}
			if flags.Has(http2.FlagHeadersPriority) {
				payload = payload[5:]
			}
			block = append(block[:0], payload...)
		case http2.FrameContinuation:
			block = append(block, payload...)
		}
		if (typ == http2.FrameHeaders || typ == http2.FrameContinuation) && flags.Has(http2.FlagHeadersEndHeaders) {
			fields, err := dec.DecodeFull(block)
			if err != nil {
				p.t.Errorf("answer proxy: request headers: %v", err)
				return
			}
			for _, f := range fields {
				if f.Name != ":path" {
					continue
				}
				if tr := p.claim(f.Value); tr != nil {
					cs.mu.Lock()
					cs.stream, cs.trap = stream, tr
					cs.mu.Unlock()
				}
			}
		}
		if _, err := server.Write(frame); err != nil {
			return
		}
	}
}

// answers forwards the server's frames until the first answer on the caught stream: lost,
// it ends the connection; held, it waits for the release.
func (p *answerProxy) answers(server, client net.Conn, cs *caughtStream) {
	for {
		frame, err := readFrame(server)
		if err != nil {
			return
		}
		typ, stream := http2.FrameType(frame[3]), binary.BigEndian.Uint32(frame[5:9])&(1<<31-1)
		if typ == http2.FrameHeaders || typ == http2.FrameData {
			cs.mu.Lock()
			tr := cs.trap
			if tr != nil && cs.stream == stream {
				cs.trap = nil
			} else {
				tr = nil
			}
			cs.mu.Unlock()
			if tr != nil {
				close(tr.caught)
				if tr.release == nil {
					return
				}
				select {
				case <-tr.release:
				case <-p.closed:
					return
				}
			}
		}
		if _, err := client.Write(frame); err != nil {
			return
		}
	}
}

// readFrame reads one HTTP/2 frame, its 9-byte header included.
func readFrame(r io.Reader) ([]byte, error) {
	header := make([]byte, 9)
	if _, err := io.ReadFull(r, header); err != nil {
		return nil, err
	}
	n := int(header[0])<<16 | int(header[1])<<8 | int(header[2])
	frame := make([]byte, 9+n)
	copy(frame, header)
	if _, err := io.ReadFull(r, frame[9:]); err != nil {
		return nil, err
	}
	return frame, nil
}
