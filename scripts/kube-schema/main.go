// Command kube-schema decodes Kubernetes objects strictly against Kubernetes' own API types
// (and the Prometheus Operator's, for PrometheusRule and PodMonitor), offline: it reads YAML
// documents on standard input and fails on a misspelled or unknown field, a value of the wrong
// type, a duplicate field, or a kind it does not know. scripts/check-chart runs every render of
// the chart through it.
package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

func main() {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		appsv1.AddToScheme,
		autoscalingv2.AddToScheme,
		batchv1.AddToScheme,
		corev1.AddToScheme,
		networkingv1.AddToScheme,
		policyv1.AddToScheme,
		monitoringv1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			fmt.Fprintln(os.Stderr, "kube-schema:", err)
			os.Exit(2)
		}
	}
	strict := json.NewSerializerWithOptions(
		json.DefaultMetaFactory, scheme, scheme, json.SerializerOptions{Yaml: true, Strict: true},
	)
	reader := utilyaml.NewYAMLReader(bufio.NewReader(os.Stdin))
	checked, refused := 0, 0
	for number := 1; ; number++ {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "kube-schema: reading the documents:", err)
			os.Exit(2)
		}
		asJSON, err := utilyaml.ToJSON(doc)
		if err != nil {
			fmt.Fprintf(os.Stderr, "document %d is not YAML: %v\n", number, err)
			refused++
			continue
		}
		if trimmed := strings.TrimSpace(string(asJSON)); trimmed == "null" || trimmed == "" {
			continue // comments only
		}
		object, kind, err := strict.Decode(doc, nil, nil)
		if err != nil {
			fmt.Fprintf(os.Stderr, "document %d: %v\n", number, err)
			refused++
			continue
		}
		name := "?"
		if accessor, err := meta.Accessor(object); err == nil {
			name = accessor.GetName()
		}
		fmt.Printf("%s/%s %s: ok\n", kind.GroupVersion(), kind.Kind, name)
		checked++
	}
	fmt.Printf("kube-schema: %d objects decoded strictly, %d refused\n", checked, refused)
	if refused > 0 || checked == 0 {
		os.Exit(1)
	}
}
