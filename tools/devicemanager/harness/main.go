// dm-harness: the kubelet's own device manager (k8s.io/kubernetes pkg/kubelet/cm/devicemanager)
// and its PodResources v1 server, driven by JSON lines on stdin, so Phalanx's Python tests can
// register a real device plugin with it and admit pods the way the kubelet does.
//
//	dm-harness --socket-dir DIR --pod-resources-socket PATH
//
// It starts the registration server at DIR/kubelet.sock (wiping DIR's sockets first, as the
// kubelet does on start; the checkpoint in DIR survives, so a second harness on the same DIR is
// a kubelet restart) and the PodResources server at PATH, prints {"ready":true}, then answers
// one JSON line per request line:
//
//	{"op":"capacity"}                          -> {"ok":true,"capacity":{res:n},"allocatable":{res:n}}
//	{"op":"admit","pod":POD}                   -> admission as HandlePodAdditions does it: the pod
//	                                              joins the pod list first, then Allocate runs for
//	                                              every init container, then every app container;
//	                                              an error rejects the pod (it leaves the list)
//	{"op":"restore","pod":POD}                 -> a pod the kubelet already admitted before a restart
//	                                              (kept in the list, no Allocate)
//	{"op":"start","uid":UID,"container":NAME}  -> GetDeviceRunContainerOptions (PreStartContainer
//	                                              runs here): {"ok":true,"options":{...}}
//	{"op":"devices","uid":UID}                 -> {"ok":true,"devices":{container:{resource:[ids]}}}
//	{"op":"remove","uid":UID}                  -> the pod ended; its devices are freed
//
// A failed request answers {"ok":false,"error":"..."}. The tool stops on EOF or SIGTERM.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	_ "unsafe" // go:linkname

	cadvisorapi "github.com/google/cadvisor/info/v1"
	"google.golang.org/grpc"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
)

// newManagerImpl is the device manager's own constructor, which its tests call with a socket
// under a temp dir; the exported NewManagerImpl hard-codes /var/lib/kubelet/device-plugins.
// Calling it lets the harness run without root or a mount namespace. Its signature is that of
// k8s.io/kubernetes v1.36.3 (pkg/kubelet/cm/devicemanager/manager.go); the version is pinned in
// go.mod, and the smoke run of build.sh starts a manager through it.
//
//go:linkname newManagerImpl k8s.io/kubernetes/pkg/kubelet/cm/devicemanager.newManagerImpl
func newManagerImpl(logger klog.Logger, socketPath string, topology []cadvisorapi.Node,
	topologyAffinityStore topologymanager.Store) (*devicemanager.ManagerImpl, error)

type request struct {
	Op        string  `json:"op"`
	Pod       *v1.Pod `json:"pod,omitempty"`
	UID       string  `json:"uid,omitempty"`
	Container string  `json:"container,omitempty"`
}

type reply map[string]any

// pods is the kubelet's pod manager as far as the device manager and PodResources see it.
type pods struct {
	mu    sync.Mutex
	order []string
	byUID map[string]*v1.Pod
}

func (p *pods) add(pod *v1.Pod) {
	p.mu.Lock()
	defer p.mu.Unlock()
	uid := string(pod.UID)
	if _, ok := p.byUID[uid]; !ok {
		p.order = append(p.order, uid)
	}
	p.byUID[uid] = pod
}

func (p *pods) remove(uid string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.byUID, uid)
	for i, u := range p.order {
		if u == uid {
			p.order = append(p.order[:i], p.order[i+1:]...)
			break
		}
	}
}

func (p *pods) get(uid string) *v1.Pod {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.byUID[uid]
}

func (p *pods) GetActivePods() []*v1.Pod {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*v1.Pod, 0, len(p.order))
	for _, uid := range p.order {
		out = append(out, p.byUID[uid])
	}
	return out
}

func (p *pods) GetPods() []*v1.Pod { return p.GetActivePods() }

func (p *pods) GetPodByName(namespace, name string) (*v1.Pod, bool) {
	for _, pod := range p.GetActivePods() {
		if pod.Namespace == namespace && pod.Name == name {
			return pod, true
		}
	}
	return nil, false
}

// devices adapts the device manager to the PodResources server, as the kubelet's container
// manager does (containerDevicesFromResourceDeviceInstances).
type devices struct{ m *devicemanager.ManagerImpl }

func (d devices) UpdateAllocatedDevices() { d.m.UpdateAllocatedDevices() }

func convert(devs devicemanager.ResourceDeviceInstances) []*podresourcesapi.ContainerDevices {
	var out []*podresourcesapi.ContainerDevices
	for resource, byID := range devs {
		ids := make([]string, 0, len(byID))
		for id := range byID {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		for _, id := range ids {
			cd := &podresourcesapi.ContainerDevices{ResourceName: resource, DeviceIds: []string{id}}
			if topo := byID[id].GetTopology(); topo != nil {
				cd.Topology = &podresourcesapi.TopologyInfo{}
				for _, n := range topo.GetNodes() {
					cd.Topology.Nodes = append(cd.Topology.Nodes, &podresourcesapi.NUMANode{ID: n.GetID()})
				}
			}
			out = append(out, cd)
		}
	}
	return out
}

func (d devices) GetDevices(podUID, containerName string) []*podresourcesapi.ContainerDevices {
	return convert(d.m.GetDevices(podUID, containerName))
}

func (d devices) GetAllocatableDevices() []*podresourcesapi.ContainerDevices {
	return convert(d.m.GetAllocatableDevices())
}

type none struct{}

func (none) GetCPUs(string, string) []int64                                    { return nil }
func (none) GetAllocatableCPUs() []int64                                         { return nil }
func (none) GetMemory(string, string) []*podresourcesapi.ContainerMemory         { return nil }
func (none) GetAllocatableMemory() []*podresourcesapi.ContainerMemory            { return nil }
func (none) GetDynamicResources(*v1.Pod, *v1.Container) []*podresourcesapi.DynamicResource { return nil }

type readySources struct{}

func (readySources) AddSource(string) {}
func (readySources) AllReady() bool   { return true }

type harness struct {
	m    *devicemanager.ManagerImpl
	pods *pods
}

func (h *harness) admit(pod *v1.Pod) error {
	h.pods.add(pod) // HandlePodAdditions adds the pod to the pod manager before admitting it
	for _, list := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			if err := h.m.Allocate(pod, &list[i]); err != nil {
				h.pods.remove(string(pod.UID))
				h.m.UpdateAllocatedDevices()
				return err
			}
		}
	}
	return nil
}

func (h *harness) container(uid, name string) (*v1.Pod, *v1.Container, error) {
	pod := h.pods.get(uid)
	if pod == nil {
		return nil, nil, fmt.Errorf("no pod with uid %s", uid)
	}
	for _, list := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			if list[i].Name == name {
				return pod, &list[i], nil
			}
		}
	}
	return nil, nil, fmt.Errorf("pod %s has no container %s", uid, name)
}

func (h *harness) handle(ctx context.Context, r request) reply {
	fail := func(err error) reply { return reply{"ok": false, "error": err.Error()} }
	switch r.Op {
	case "capacity":
		capacity, allocatable, _ := h.m.GetCapacity()
		c, a := map[string]int64{}, map[string]int64{}
		for k, v := range capacity {
			c[string(k)] = v.Value()
		}
		for k, v := range allocatable {
			a[string(k)] = v.Value()
		}
		return reply{"ok": true, "capacity": c, "allocatable": a}
	case "admit", "restore":
		if r.Pod == nil || r.Pod.UID == "" {
			return fail(fmt.Errorf("%s needs a pod with metadata.uid", r.Op))
		}
		if r.Op == "restore" {
			h.pods.add(r.Pod)
			return reply{"ok": true}
		}
		if err := h.admit(r.Pod); err != nil {
			return fail(err)
		}
		return reply{"ok": true}
	case "start":
		pod, c, err := h.container(r.UID, r.Container)
		if err != nil {
			return fail(err)
		}
		opts, err := h.m.GetDeviceRunContainerOptions(ctx, pod, c)
		if err != nil {
			return fail(err)
		}
		return reply{"ok": true, "options": opts}
	case "devices":
		pod := h.pods.get(r.UID)
		if pod == nil {
			return fail(fmt.Errorf("no pod with uid %s", r.UID))
		}
		out := map[string]map[string][]string{}
		for _, list := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
			for _, c := range list {
				per := map[string][]string{}
				for resource, byID := range h.m.GetDevices(r.UID, c.Name) {
					ids := sets.List(sets.KeySet(byID))
					per[resource] = ids
				}
				out[c.Name] = per
			}
		}
		return reply{"ok": true, "devices": out}
	case "remove":
		h.pods.remove(r.UID)
		h.m.UpdateAllocatedDevices()
		return reply{"ok": true}
	}
	return fail(fmt.Errorf("unknown op %q", r.Op))
}

func main() {
	socketDir := flag.String("socket-dir", "", "device-plugin directory (kubelet.sock and the checkpoint go here)")
	prSocket := flag.String("pod-resources-socket", "", "path of the PodResources v1 socket to serve")
	flag.Parse()
	if *socketDir == "" || *prSocket == "" {
		fmt.Fprintln(os.Stderr, "dm-harness: --socket-dir and --pod-resources-socket are required")
		os.Exit(2)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	logger := klog.Background()

	m, err := newManagerImpl(logger, filepath.Join(*socketDir, "kubelet.sock"), nil, topologymanager.NewFakeManager())
	if err != nil {
		fmt.Fprintln(os.Stderr, "dm-harness: device manager:", err)
		os.Exit(1)
	}
	h := &harness{m: m, pods: &pods{byUID: map[string]*v1.Pod{}}}
	if err := m.Start(logger, h.pods.GetActivePods, readySources{}, containermap.NewContainerMap(),
		sets.New[string]()); err != nil {
		fmt.Fprintln(os.Stderr, "dm-harness: start:", err)
		os.Exit(1)
	}
	defer m.Stop(logger)

	_ = os.Remove(*prSocket)
	ln, err := net.Listen("unix", *prSocket)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dm-harness: pod resources socket:", err)
		os.Exit(1)
	}
	srv := grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(srv, podresources.NewV1PodResourcesServer(ctx,
		podresources.PodResourcesProviders{Pods: h.pods, Devices: devices{m}, Cpus: none{}, Memory: none{},
			DynamicResources: none{}}))
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()

	out := json.NewEncoder(os.Stdout)
	_ = out.Encode(reply{"ready": true})
	lines := make(chan []byte)
	go func() {
		in := bufio.NewScanner(os.Stdin)
		in.Buffer(make([]byte, 1<<20), 16<<20)
		for in.Scan() {
			lines <- append([]byte(nil), in.Bytes()...)
		}
		close(lines)
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case line, ok := <-lines:
			if !ok {
				return
			}
			var r request
			if err := json.Unmarshal(line, &r); err != nil {
				_ = out.Encode(reply{"ok": false, "error": "bad request: " + err.Error()})
				continue
			}
			_ = out.Encode(h.handle(ctx, r))
		}
	}
}
