// Package child runs the throwaway servers that tests and demos start
// (PostgreSQL, PgBouncer, the checkout service) as child processes that do
// not outlive this one, and keeps their private directories tidy.
//
// A child gets a parent-death signal: when this process dies without
// stopping it (a panic, a test timeout, SIGKILL), the kernel signals the
// child too. Linux sends that signal when the thread that started the child
// exits, not the process, and the Go runtime ends a thread whenever a
// goroutine locked to it exits. Start therefore starts each child from a
// goroutine that locks its thread and keeps it until the child has exited:
// no other part of the process can take the child down by ending a thread.
//
// A child's directory records the PID of the process that made it
// (NewDir); RemoveStale deletes the directories whose owner died without
// cleaning up, once their server is gone too.
package child
