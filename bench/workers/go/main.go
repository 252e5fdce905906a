// Command workers is the Go side of bench/workers.py: a worker of one pool that completes
// every lease at once, either through the SDK's RunWorker (-mode sdk) or straight on the
// generated stubs (-mode raw, the baseline that shows what the SDK adds).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"syscall"

	cronoq "github.com/synaptiai/cronoq/sdks/go"
	pb "github.com/synaptiai/cronoq/sdks/go/cronoqpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func main() {
	mode := flag.String("mode", "raw", "raw or sdk")
	target := flag.String("target", "", "the server's host:port")
	pool := flag.String("pool", "default", "the pool to serve")
	slots := flag.Int("slots", 64, "slots to ask for")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	var err error
	if *mode == "sdk" {
		err = cronoq.RunWorker(ctx, cronoq.WorkerOptions{
			Target: *target, Pool: *pool, Slots: *slots, Name: "bench-go-sdk",
		}, func(context.Context, *cronoq.Lease) ([]byte, error) { return nil, nil })
	} else {
		err = raw(ctx, *target, *pool, *slots)
	}
	if err != nil {
		log.Fatal(err)
	}
}

// raw registers and answers each Lease with a Complete on the same goroutine: no handler
// goroutines, no heartbeats, nothing but the protocol's minimum.
func raw(ctx context.Context, target, pool string, slots int) error {
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	stream, err := pb.NewWorkersClient(conn).Work(ctx)
	if err != nil {
		return err
	}
	err = stream.Send(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Register{Register: &pb.Register{
		Pool: pool, Slots: uint32(slots), WorkerName: "bench-go-raw", ProtocolVersion: 3,
	}}})
	if err != nil {
		return err
	}
	for {
		m, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) || ctx.Err() != nil {
				return nil
			}
			return err
		}
		switch msg := m.Msg.(type) {
		case *pb.ServerMessage_Registered:
			fmt.Printf("registered slots=%d\n", msg.Registered.Slots)
		case *pb.ServerMessage_Lease:
			done := &pb.WorkerMessage{Msg: &pb.WorkerMessage_Complete{
				Complete: &pb.Complete{Lease: msg.Lease.Lease}}}
			if err := stream.Send(done); err != nil {
				return err
			}
		case *pb.ServerMessage_Shutdown:
			return nil
		}
	}
}
