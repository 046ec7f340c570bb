// Command mpi-operator runs the Kubeflow MPI Operator's v2beta1 MPIJob controller
// (github.com/kubeflow/mpi-operator/pkg/controller) against one API server, for tests.
//
// Upstream's cmd/mpi-operator always runs leader election (a Lease in --lock-namespace)
// and serves its health check on the fixed port :8080 on every interface, exiting when
// the port is taken. Test control planes run side by side on one machine and listen on
// loopback only, so this entry point wires the same controller, informers and clients
// without leader election and serves /healthz and /readyz on --health-addr; /readyz
// turns 200 once every informer cache has synced, so a caller knows MPIJobs will be
// reconciled from then on. The reconciliation itself is entirely upstream's.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"

	kubeinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog"
	schedclientset "sigs.k8s.io/scheduler-plugins/pkg/generated/clientset/versioned"
	volcanoclient "volcano.sh/apis/pkg/client/clientset/versioned"

	"github.com/kubeflow/mpi-operator/cmd/mpi-operator/app/options"
	mpijobclientset "github.com/kubeflow/mpi-operator/pkg/client/clientset/versioned"
	kubeflowscheme "github.com/kubeflow/mpi-operator/pkg/client/clientset/versioned/scheme"
	informers "github.com/kubeflow/mpi-operator/pkg/client/informers/externalversions"
	"github.com/kubeflow/mpi-operator/pkg/controller"
	"github.com/kubeflow/mpi-operator/pkg/version"
)

func main() {
	klog.InitFlags(nil)
	kubeconfig := flag.String("kubeconfig", "", "path to the kubeconfig of the API server (required)")
	healthAddr := flag.String("health-addr", "127.0.0.1:0", "host:port of /healthz and /readyz")
	namespace := flag.String("namespace", "", "reconcile MPIJobs of this namespace only (default: all)")
	threadiness := flag.Int("threadiness", 2, "number of reconcile workers")
	gang := flag.String("gang-scheduling", "", `"volcano", "scheduler-plugins" or empty: the PodGroup kind to create`)
	qps := flag.Float64("kube-api-qps", 50, "client QPS")
	burst := flag.Int("kube-api-burst", 100, "client burst")
	printVersion := flag.Bool("version", false, "print the operator version and exit")
	flag.Parse()
	if *printVersion {
		for _, line := range version.Info("v2") {
			fmt.Println(line)
		}
		return
	}
	if err := run(*kubeconfig, *healthAddr, *namespace, *gang, *threadiness, float32(*qps), *burst); err != nil {
		klog.Errorf("mpi-operator: %v", err)
		os.Exit(1)
	}
}

func run(kubeconfig, healthAddr, namespace, gang string, threadiness int, qps float32, burst int) error {
	if kubeconfig == "" {
		return errors.New("--kubeconfig is required")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = qps, burst
	kubeClient, err := kubernetes.NewForConfig(rest.AddUserAgent(cfg, "mpi-operator"))
	if err != nil {
		return err
	}
	mpiClient, err := mpijobclientset.NewForConfig(cfg)
	if err != nil {
		return err
	}
	var volcano volcanoclient.Interface
	var sched schedclientset.Interface
	switch gang {
	case "":
	case options.GangSchedulerVolcano:
		if volcano, err = volcanoclient.NewForConfig(cfg); err != nil {
			return err
		}
	default: // upstream treats any other name as scheduler-plugins
		if sched, err = schedclientset.NewForConfig(cfg); err != nil {
			return err
		}
	}
	// Events about MPIJobs need the kubeflow types in the scheme the recorder uses.
	if err := kubeflowscheme.AddToScheme(clientgoscheme.Scheme); err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	kubeFactory := kubeinformers.NewSharedInformerFactoryWithOptions(kubeClient, 0, kubeinformers.WithNamespace(namespace))
	mpiFactory := informers.NewSharedInformerFactoryWithOptions(mpiClient, 0, informers.WithNamespace(namespace))
	ctl, err := controller.NewMPIJobController(kubeClient, mpiClient, volcano, sched,
		kubeFactory.Core().V1().ConfigMaps(), kubeFactory.Core().V1().Secrets(),
		kubeFactory.Core().V1().Services(), kubeFactory.Batch().V1().Jobs(),
		kubeFactory.Core().V1().Pods(), kubeFactory.Scheduling().V1().PriorityClasses(),
		mpiFactory.Kubeflow().V2beta1().MPIJobs(), namespace, gang)
	if err != nil {
		return fmt.Errorf("new MPIJob controller: %w", err)
	}

	var ready atomic.Bool
	srvErr, err := serveHealth(ctx, healthAddr, &ready)
	if err != nil {
		return err
	}

	kubeFactory.Start(ctx.Done())
	mpiFactory.Start(ctx.Done())
	if ctl.PodGroupCtrl != nil {
		ctl.PodGroupCtrl.StartInformerFactory(ctx.Done())
	}
	for typ, ok := range kubeFactory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("informer cache of %v never synced", typ)
		}
	}
	for typ, ok := range mpiFactory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("informer cache of %v never synced", typ)
		}
	}
	ready.Store(true)
	klog.Infof("mpi-operator %s: caches synced, reconciling MPIJobs", version.Version)

	runErr := make(chan error, 1)
	go func() { runErr <- ctl.Run(threadiness, ctx.Done()) }()
	select {
	case err := <-srvErr:
		return fmt.Errorf("health server: %w", err)
	case err := <-runErr:
		return err
	}
}

// serveHealth listens on addr (failing now if it cannot) and serves /healthz (always 200)
// and /readyz (200 once ready is set). Its errors arrive on the returned channel.
func serveHealth(ctx context.Context, addr string, ready *atomic.Bool) (<-chan error, error) {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			http.Error(w, "informer caches not synced yet", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	srv := &http.Server{Addr: addr, Handler: mux}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("health server on %s: %w", addr, err)
	}
	klog.Infof("health checks on http://%s/healthz and /readyz", ln.Addr())
	errs := make(chan error, 1)
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs <- err
		}
	}()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	return errs, nil
}
