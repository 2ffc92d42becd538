package pgproxy

import (
	"bytes"
	"net"
	"sync"
	"time"
)

// delayQueue bounds the writes a delayed connection holds: a writer that
// gets that far ahead of the network waits, as on a full socket buffer.
const delayQueue = 1024

// delayed is a connection whose writes arrive a delay after they are made.
// Each Write is queued with its due time and written by a goroutine of its
// own once due, so that the delay adds to every message's latency without
// limiting the throughput, as a network's does: two writes made together
// arrive together, a delay later.
type delayed struct {
	net.Conn
	delay time.Duration
	queue chan packet
	done  chan struct{} // closed by Close
	once  sync.Once
}

// packet is one write on its way.
type packet struct {
	due  time.Time
	data []byte
}

// delay returns conn with its writes delayed by d, and counts the
// goroutine that delivers them in wg; conn itself when d is not positive.
func delay(conn net.Conn, d time.Duration, wg *sync.WaitGroup) net.Conn {
	if d <= 0 {
		return conn
	}
	c := &delayed{Conn: conn, delay: d, queue: make(chan packet, delayQueue), done: make(chan struct{})}
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.deliver()
	}()
	return c
}

// Write queues b, to be written when the delay has passed.
func (c *delayed) Write(b []byte) (int, error) {
	p := packet{due: time.Now().Add(c.delay), data: bytes.Clone(b)}
	select {
	case <-c.done:
		return 0, net.ErrClosed
	default:
	}
	select {
	case c.queue <- p:
		return len(b), nil
	case <-c.done:
		return 0, net.ErrClosed
	}
}

// deliver writes each queued packet when it is due. After Close it
// delivers what was queued, as a network delivers what was sent before a
// close, then closes the connection.
func (c *delayed) deliver() {
	defer c.Conn.Close()
	for {
		select {
		case p := <-c.queue:
			if !c.send(p) {
				return
			}
		case <-c.done:
			for {
				select {
				case p := <-c.queue:
					if !c.send(p) {
						return
					}
				default:
					return
				}
			}
		}
	}
}

func (c *delayed) send(p packet) bool {
	sleepUntil(p.due)
	_, err := c.Conn.Write(p.data)
	return err == nil
}

// Close closes the connection once what was written before has been
// delivered, within the delay, or at most a second later if the peer does
// not read it. It is safe to call more than once.
func (c *delayed) Close() error {
	c.once.Do(func() {
		close(c.done)
		_ = c.Conn.SetWriteDeadline(time.Now().Add(c.delay + time.Second))
	})
	return nil
}
