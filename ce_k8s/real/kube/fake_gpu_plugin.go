// ce-k8s-fake-gpu: a Kubernetes device plugin (v1beta1) for a test node without GPUs (test tool only).
//
// It stands in for the one piece a real node here lacks, the GPU and its vendor's plugin, and
// speaks the kubelet's own device-plugin API: it registers `--resource` with the kubelet's
// Registration service, lists `--count` healthy devices named `--prefix` and eight hex digits of
// their index (a GPU UUID's shape, `GPU-` and 8-4-4-4-12 hex digits, as NVIDIA's plugin names
// devices with its default `uuid` strategy: HTCondor passes such an ID on to CUDA_VISIBLE_DEVICES
// as it is, and keeps only the digits of any other), and answers each Allocate with
// the environment NVIDIA's plugin sets in its default `envvar` strategy, NVIDIA_VISIBLE_DEVICES
// naming the devices the kubelet chose. Which devices a pod gets, that no two pods share one, and
// that a pod asking for more than is free waits, are the kubelet's and the scheduler's decisions.
// Each allocation is logged on stdout as `allocate <ids>`.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	devices []*pluginapi.Device
	done    chan struct{}
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *plugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	select {
	case <-stream.Context().Done():
	case <-p.done:
	}
	return nil
}

func (p *plugin) GetPreferredAllocation(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return &pluginapi.PreferredAllocationResponse{}, nil
}

func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		ids := strings.Join(c.DevicesIds, ",")
		fmt.Printf("allocate %s\n", ids)
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": ids},
		})
	}
	return resp, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

func main() {
	dir := flag.String("dir", pluginapi.DevicePluginPath, "the kubelet's device-plugin directory")
	resource := flag.String("resource", "nvidia.com/gpu", "the extended resource to advertise")
	count := flag.Int("count", 2, "how many devices")
	prefix := flag.String("prefix", "GPU-00000000-0000-4000-8000-ce8c", "device IDs are this prefix and 8 hex digits of an index")
	flag.Parse()
	log.SetFlags(0)

	p := &plugin{done: make(chan struct{})}
	for i := 0; i < *count; i++ {
		p.devices = append(p.devices, &pluginapi.Device{ID: fmt.Sprintf("%s%08x", *prefix, i), Health: pluginapi.Healthy})
	}
	endpoint := "ce-k8s-fake-gpu.sock"
	sock := filepath.Join(*dir, endpoint)
	_ = os.Remove(sock)
	lis, err := net.Listen("unix", sock)
	if err != nil {
		log.Fatalf("listen %s: %v", sock, err)
	}
	server := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(server, p)
	go func() { _ = server.Serve(lis) }()

	conn, err := grpc.NewClient("unix://"+filepath.Join(*dir, "kubelet.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatalf("dial the kubelet: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: endpoint, ResourceName: *resource,
		Options: &pluginapi.DevicePluginOptions{},
	}, grpc.WaitForReady(true))
	cancel()
	_ = conn.Close()
	if err != nil {
		log.Fatalf("register %s with the kubelet: %v", *resource, err)
	}
	fmt.Printf("registered %s: %d devices\n", *resource, *count)

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
	close(p.done)
	server.Stop()
	_ = os.Remove(sock)
}
