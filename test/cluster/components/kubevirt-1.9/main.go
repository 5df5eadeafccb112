// kubevirt-vmi: KubeVirt's own handling of a VirtualMachineInstance's DRA devices, for the tests
// (test/cluster, test/real-node), at the KubeVirt release pinned in go.mod.
//
// In a cluster, virt-operator installs the VMI CustomResourceDefinition and virt-api judges each
// new VMI in a validating webhook. Neither can run here (no images), and their packages cannot be
// built from the module proxy (it refuses kubevirt.io/virt-template-api, which they import). What
// can be: KubeVirt's API types, the admission checks that judge what vfio-dra's users write
// (resourceClaims, DRA GPUs and host devices, networks backed by a claim, feature gates), and
// virt-launcher's reading of the DRA metadata files into the domain's host devices. So:
//
//	kubevirt-vmi crd --kubevirt-source DIR
//	    prints the VirtualMachineInstance CRD: names and versions from kubevirt.io/api, and the
//	    OpenAPI schema virt-operator installs, read from the generated validations of the
//	    kubevirt.io/kubevirt module in DIR (it is data there, not importable code)
//	kubevirt-vmi serve --listen ADDR --cert FILE --key FILE --feature-gates A,B
//	    a validating webhook at virt-api's path for VMI creation that runs those KubeVirt checks
//	    with a KubeVirt configuration enabling the given gates; prints "serving URL" once it
//	    accepts connections
//	kubevirt-vmi launcher-devices --vmi JSON [--metadata-dir DIR]
//	    what virt-launcher makes of the VMI's DRA GPUs and host devices in this container: it
//	    reads their metadata files (under DIR, by default where the kubelet mounts them) with
//	    virt-launcher's own code and prints each libvirt <hostdev>, then one line per device:
//	    "NAME pci DOMAIN:BUS:SLOT.FUNCTION" or "NAME mdev UUID". SR-IOV networks are not
//	    covered: that code of virt-launcher needs libvirt's C library.
//
// Errors go to stderr with a non-zero exit.
package main

import (
	"encoding/json"
	"encoding/xml"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	extv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/yaml"

	v1 "kubevirt.io/api/core/v1"
	drautil "kubevirt.io/kubevirt/pkg/dra"
	draadmitter "kubevirt.io/kubevirt/pkg/dra/admitter"
	netadmitter "kubevirt.io/kubevirt/pkg/network/admitter"
	virtconfig "kubevirt.io/kubevirt/pkg/virt-config"
	"kubevirt.io/kubevirt/pkg/virt-config/featuregate"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/api"
	launcherdra "kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/device/hostdevice/dra"
)

const (
	// virt-api's path for VMI creation (components.VMICreateValidatePath).
	createPath = "/virtualmachineinstances-validate-create"
	// Where virt-operator keeps the generated schemas, inside the kubevirt.io/kubevirt module.
	validationsFile = "pkg/virt-operator/resource/generate/components/validations_generated.go"
	// The namespace virt-api reads its KubeVirt object from; only this program reads it.
	kubevirtNamespace = "kubevirt"
)

func main() {
	if len(os.Args) < 2 {
		fail(errors.New("usage: kubevirt-vmi crd --kubevirt-source DIR | " +
			"serve --listen ADDR --cert FILE --key FILE --feature-gates A,B | " +
			"launcher-devices --vmi JSON [--metadata-dir DIR]"))
	}
	var err error
	switch os.Args[1] {
	case "crd":
		err = printCRD(os.Args[2:], os.Stdout)
	case "serve":
		err = serve(os.Args[2:])
	case "launcher-devices":
		err = launcherDevices(os.Args[2:], os.Stdout)
	default:
		err = fmt.Errorf("unknown command %q (crd, serve or launcher-devices)", os.Args[1])
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "kubevirt-vmi:", err)
	os.Exit(1)
}

// generatedSchema returns the schema virt-operator installs for the CRD whose singular name is
// given: the string under that key of CRDsValidation in the generated file.
func generatedSchema(path, singular string) (string, error) {
	file, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		return "", fmt.Errorf("reading KubeVirt's generated validations: %w", err)
	}
	var schema string
	var found bool
	ast.Inspect(file, func(n ast.Node) bool {
		kv, ok := n.(*ast.KeyValueExpr)
		if !ok || found {
			return !found
		}
		key, ok := kv.Key.(*ast.BasicLit)
		if !ok || key.Kind != token.STRING {
			return true
		}
		if name, err := strconv.Unquote(key.Value); err != nil || name != singular {
			return true
		}
		if value, ok := kv.Value.(*ast.BasicLit); ok && value.Kind == token.STRING {
			schema, err = strconv.Unquote(value.Value)
			found = err == nil
		}
		return !found
	})
	if !found {
		return "", fmt.Errorf("%s holds no schema for %q: has KubeVirt moved its generated validations?",
			path, singular)
	}
	return schema, nil
}

func printCRD(args []string, out io.Writer) error {
	flags := flag.NewFlagSet("crd", flag.ContinueOnError)
	source := flags.String("kubevirt-source", "", "the kubevirt.io/kubevirt module's directory")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if *source == "" {
		return errors.New("crd needs --kubevirt-source (go list -m -f '{{.Dir}}' kubevirt.io/kubevirt)")
	}
	const singular = "virtualmachineinstance"
	text, err := generatedSchema(filepath.Join(*source, validationsFile), singular)
	if err != nil {
		return err
	}
	var validation extv1.CustomResourceValidation
	if err := yaml.UnmarshalStrict([]byte(text), &validation); err != nil {
		return fmt.Errorf("decoding KubeVirt's schema for %s: %w", singular, err)
	}
	gvk := v1.VirtualMachineInstanceGroupVersionKind
	versions := make([]extv1.CustomResourceDefinitionVersion, len(v1.ApiSupportedVersions))
	copy(versions, v1.ApiSupportedVersions)
	for i := range versions {
		versions[i].Schema = validation.DeepCopy()
	}
	crd := extv1.CustomResourceDefinition{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"},
		ObjectMeta: metav1.ObjectMeta{Name: "virtualmachineinstances." + gvk.Group},
		Spec: extv1.CustomResourceDefinitionSpec{
			Group:    gvk.Group,
			Versions: versions,
			Scope:    extv1.NamespaceScoped,
			Names: extv1.CustomResourceDefinitionNames{
				Plural: "virtualmachineinstances", Singular: singular, Kind: gvk.Kind,
				ShortNames: []string{"vmi", "vmis"}, Categories: []string{"all"},
			},
		},
	}
	// A CRD's status is the API server's to write: leave it out rather than send an empty one.
	object, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&crd)
	if err != nil {
		return fmt.Errorf("converting the VirtualMachineInstance CRD: %w", err)
	}
	delete(object, "status")
	encoded, err := yaml.Marshal(object)
	if err != nil {
		return fmt.Errorf("encoding the VirtualMachineInstance CRD: %w", err)
	}
	_, err = out.Write(encoded)
	return err
}

// clusterConfig is what virt-api reads from the KubeVirt object: one that exists, is deployed,
// and enables the given feature gates. Its informers are never started; the store holds the one
// object, as a synced informer's would.
func clusterConfig(gates []string) (*virtconfig.ClusterConfig, error) {
	noList := &cache.ListWatch{}
	crds := cache.NewSharedIndexInformer(noList, &extv1.CustomResourceDefinition{}, 0, cache.Indexers{})
	kubevirts := cache.NewSharedIndexInformer(noList, &v1.KubeVirt{}, 0, cache.Indexers{})
	kv := &v1.KubeVirt{
		ObjectMeta: metav1.ObjectMeta{Name: "kubevirt", Namespace: kubevirtNamespace, ResourceVersion: "1"},
		Spec: v1.KubeVirtSpec{Configuration: v1.KubeVirtConfiguration{
			DeveloperConfiguration: &v1.DeveloperConfiguration{FeatureGates: gates},
		}},
		Status: v1.KubeVirtStatus{Phase: v1.KubeVirtPhaseDeployed},
	}
	if err := kubevirts.GetStore().Add(kv); err != nil {
		return nil, fmt.Errorf("storing the KubeVirt configuration: %w", err)
	}
	return virtconfig.NewClusterConfig(crds, kubevirts, kubevirtNamespace)
}

// judge runs the checks of virt-api's VMI creation admission that concern what vfio-dra's users
// write, in virt-api's order: the feature gates the spec needs, the networks (a claim-backed
// network among them), and the DRA resource claims of GPUs, host devices and networks.
func judge(vmi *v1.VirtualMachineInstance, gates []string, config *virtconfig.ClusterConfig) []metav1.StatusCause {
	spec := field.NewPath("spec")
	causes := featuregate.ValidateFeatureGates(gates, &vmi.Spec)
	causes = append(causes, netadmitter.Validate(spec, &vmi.Spec, config)...)
	causes = append(causes, draadmitter.ValidateCreation(spec, &vmi.Spec, config)...)
	return causes
}

func review(body []byte, gates []string, config *virtconfig.ClusterConfig) (*admissionv1.AdmissionReview, error) {
	var in admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, fmt.Errorf("decoding the AdmissionReview: %w", err)
	}
	if in.Request == nil {
		return nil, errors.New("the AdmissionReview has no request")
	}
	response := &admissionv1.AdmissionResponse{UID: in.Request.UID, Allowed: true}
	var vmi v1.VirtualMachineInstance
	if err := json.Unmarshal(in.Request.Object.Raw, &vmi); err != nil {
		response.Allowed = false
		response.Result = &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusBadRequest,
			Message: fmt.Sprintf("decoding the VirtualMachineInstance: %v", err)}
	} else if causes := judge(&vmi, gates, config); len(causes) > 0 {
		// As virt-api answers: 422 with the causes, the first one's message as the summary.
		response.Allowed = false
		response.Result = &metav1.Status{Status: metav1.StatusFailure,
			Code: http.StatusUnprocessableEntity, Reason: metav1.StatusReasonInvalid,
			Message: causes[0].Message, Details: &metav1.StatusDetails{Causes: causes}}
	}
	return &admissionv1.AdmissionReview{TypeMeta: in.TypeMeta, Response: response}, nil
}

func serve(args []string) error {
	flags := flag.NewFlagSet("serve", flag.ContinueOnError)
	listen := flags.String("listen", "", "address to listen on, e.g. 127.0.0.1:0")
	cert := flags.String("cert", "", "serving certificate (PEM)")
	key := flags.String("key", "", "serving key (PEM)")
	gateList := flags.String("feature-gates", "", "KubeVirt feature gates to enable, comma-separated")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if *listen == "" || *cert == "" || *key == "" {
		return errors.New("serve needs --listen, --cert and --key")
	}
	var gates []string
	for _, g := range strings.Split(*gateList, ",") {
		if g = strings.TrimSpace(g); g != "" {
			gates = append(gates, g)
		}
	}
	config, err := clusterConfig(gates)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc(createPath, func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 16<<20))
		if err != nil {
			http.Error(w, fmt.Sprintf("reading the request: %v", err), http.StatusBadRequest)
			return
		}
		out, err := review(body, gates, config)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if err := json.NewEncoder(w).Encode(out); err != nil {
			fmt.Fprintln(os.Stderr, "kubevirt-vmi: writing the answer:", err)
		}
	})
	listener, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", *listen, err)
	}
	fmt.Printf("serving https://%s%s\n", listener.Addr(), createPath)
	return http.ServeTLS(listener, mux, *cert, *key)
}

// pciName turns a libvirt PCI address (0x-prefixed hex fields) into the sysfs name.
func pciName(a *api.Address) (string, error) {
	var fields [4]uint64
	for i, text := range []string{a.Domain, a.Bus, a.Slot, a.Function} {
		value, err := strconv.ParseUint(strings.TrimPrefix(text, "0x"), 16, 32)
		if err != nil {
			return "", fmt.Errorf("libvirt PCI address %+v: field %q: %w", *a, text, err)
		}
		fields[i] = value
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", fields[0], fields[1], fields[2], fields[3]), nil
}

func launcherDevices(args []string, out io.Writer) error {
	flags := flag.NewFlagSet("launcher-devices", flag.ContinueOnError)
	spec := flags.String("vmi", "", "the VirtualMachineInstance (JSON)")
	dir := flags.String("metadata-dir", drautil.DefaultMetadataBasePath, "where the kubelet mounts the DRA metadata")
	if err := flags.Parse(args); err != nil {
		return err
	}
	var vmi v1.VirtualMachineInstance
	if err := json.Unmarshal([]byte(*spec), &vmi); err != nil {
		return fmt.Errorf("decoding --vmi: %w", err)
	}
	gpus, err := launcherdra.CreateDRAGPUHostDevices(&vmi, *dir)
	if err != nil {
		return err
	}
	hostDevices, err := launcherdra.CreateDRAHostDevices(&vmi, *dir)
	if err != nil {
		return err
	}
	all := append(gpus, hostDevices...)
	if len(all) == 0 {
		return errors.New("the VMI has no DRA GPU or host device")
	}
	var lines []string
	for _, device := range all {
		encoded, err := xml.MarshalIndent(device, "", "  ")
		if err != nil {
			return fmt.Errorf("encoding the libvirt hostdev: %w", err)
		}
		fmt.Fprintln(out, string(encoded))
		name := ""
		if device.Alias != nil {
			name = device.Alias.GetName()
		}
		switch {
		case device.Type == api.HostDeviceMDev && device.Source.Address != nil:
			lines = append(lines, fmt.Sprintf("%s mdev %s", name, device.Source.Address.UUID))
		case device.Type == api.HostDevicePCI && device.Source.Address != nil:
			pci, err := pciName(device.Source.Address)
			if err != nil {
				return err
			}
			lines = append(lines, fmt.Sprintf("%s pci %s", name, pci))
		default:
			return fmt.Errorf("a libvirt hostdev of type %q without a source address", device.Type)
		}
	}
	for _, line := range lines {
		fmt.Fprintln(out, line)
	}
	return nil
}
