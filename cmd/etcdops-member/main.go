// Command etcdops-member is what the operator's member Jobs and etcd pods run: one subcommand
// per membership change, the etcd pod's launcher, and install to copy itself into a pod.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"etcdops.dev/etcdops/cmd/etcdops-member/membertool"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := membertool.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
