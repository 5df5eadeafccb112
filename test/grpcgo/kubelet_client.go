// kubelet-grpcgo-client: plays the kubelet's side of DRA against a running vfio-dra daemon with
// grpc-go, the gRPC implementation real kubelets use, so the plugin's server is checked against
// that client and not only against gRPC C++ (test/integration/grpcgo_client_test.cc runs it).
// It prints one JSON object per step on stdout. Messages are encoded and decoded by hand from the
// field numbers in proto/*.proto, so the program needs nothing but grpc-go and the standard
// library: Debian 12 has no Go code generated from these protos, and its Go protobuf (1.3) has no
// protowire, nor a proto.Buffer that tells where it stands.
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// The kubelet's bounds (pluginmanager and DRA manager): dial, GetInfo, NotifyRegistrationStatus
// and the DRA calls.
const (
	registrationDialTimeout = 10 * time.Second
	getInfoTimeout          = 1 * time.Second
	notifyTimeout           = 5 * time.Second
	draCallTimeout          = 45 * time.Second
	// Not a kubelet bound: how long the test is willing to wait for the first health message on a
	// busy machine.
	firstHealthMessageTimeout = 30 * time.Second
)

const (
	draV1      = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/"
	draV1beta1 = "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/"
	healthV1   = "/grpc.health.v1.Health/Check"
	watchV1    = "/v1.DRAResourceHealth/NodeWatchResources"
	watchAlpha = "/v1alpha1.DRAResourceHealth/NodeWatchResources"
)

// rawCodec hands grpc-go the bytes this program encoded itself, and gives back what came off the
// wire, so no generated Go code is needed.
type rawCodec struct{}

func (rawCodec) Marshal(v interface{}) ([]byte, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("rawCodec: cannot marshal %T", v)
	}
	return *b, nil
}

func (rawCodec) Unmarshal(data []byte, v interface{}) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("rawCodec: cannot unmarshal into %T", v)
	}
	*b = append((*b)[:0], data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }

// --- protobuf wire format, only what these messages use ---

const (
	wireVarint  = 0
	wireFixed64 = 1
	wireBytes   = 2
	wireFixed32 = 5
)

func appendTag(b []byte, field, wire int) []byte {
	return binary.AppendUvarint(b, uint64(field)<<3|uint64(wire))
}

func appendBytesField(b []byte, field int, v []byte) []byte {
	b = appendTag(b, field, wireBytes)
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

func appendStringField(b []byte, field int, s string) []byte {
	if s == "" {
		return b // proto3 leaves default values out
	}
	return appendBytesField(b, field, []byte(s))
}

func appendBoolField(b []byte, field int, v bool) []byte {
	if !v {
		return b
	}
	return binary.AppendUvarint(appendTag(b, field, wireVarint), 1)
}

type wireField struct {
	num    int
	wire   int
	varint uint64
	bytes  []byte
}

// parseFields splits a message into its fields; anything truncated or of a wire type proto3 does
// not produce is an error, as a strict decoder would report it.
func parseFields(b []byte) ([]wireField, error) {
	var out []wireField
	for len(b) > 0 {
		tag, n := binary.Uvarint(b)
		if n <= 0 {
			return nil, errors.New("bad tag varint")
		}
		b = b[n:]
		f := wireField{num: int(tag >> 3), wire: int(tag & 7)}
		if f.num == 0 {
			return nil, errors.New("field number 0")
		}
		switch f.wire {
		case wireVarint:
			v, n := binary.Uvarint(b)
			if n <= 0 {
				return nil, fmt.Errorf("field %d: bad varint", f.num)
			}
			f.varint, b = v, b[n:]
		case wireFixed64, wireFixed32:
			size := 8
			if f.wire == wireFixed32 {
				size = 4
			}
			if len(b) < size {
				return nil, fmt.Errorf("field %d: truncated fixed value", f.num)
			}
			f.bytes, b = b[:size], b[size:]
		case wireBytes:
			l, n := binary.Uvarint(b)
			if n <= 0 || uint64(len(b)-n) < l {
				return nil, fmt.Errorf("field %d: truncated length-delimited value", f.num)
			}
			f.bytes, b = b[n:n+int(l)], b[n+int(l):]
		default:
			return nil, fmt.Errorf("field %d: wire type %d", f.num, f.wire)
		}
		out = append(out, f)
	}
	return out, nil
}

// --- the messages ---

type pluginInfo struct {
	Type              string   `json:"type"`
	Name              string   `json:"name"`
	Endpoint          string   `json:"endpoint"`
	SupportedVersions []string `json:"supported_versions"`
}

func decodePluginInfo(b []byte) (pluginInfo, error) {
	info := pluginInfo{SupportedVersions: []string{}}
	fields, err := parseFields(b)
	if err != nil {
		return info, err
	}
	for _, f := range fields {
		switch f.num {
		case 1:
			info.Type = string(f.bytes)
		case 2:
			info.Name = string(f.bytes)
		case 3:
			info.Endpoint = string(f.bytes)
		case 4:
			info.SupportedVersions = append(info.SupportedVersions, string(f.bytes))
		}
	}
	return info, nil
}

type claimRef struct {
	Namespace, Name, UID string
}

func encodeClaims(claims []claimRef) []byte {
	var b []byte
	for _, c := range claims {
		var m []byte
		m = appendStringField(m, 1, c.Namespace)
		m = appendStringField(m, 2, c.UID)
		m = appendStringField(m, 3, c.Name)
		b = appendBytesField(b, 1, m)
	}
	return b
}

type device struct {
	RequestNames []string `json:"request_names"`
	Pool         string   `json:"pool"`
	Device       string   `json:"device"`
	CDIDeviceIDs []string `json:"cdi_device_ids"`
	ShareID      *string  `json:"share_id,omitempty"`
}

type claimResult struct {
	Devices []device `json:"devices,omitempty"`
	Error   string   `json:"error"`
}

func decodeDevice(b []byte) (device, error) {
	d := device{RequestNames: []string{}, CDIDeviceIDs: []string{}}
	fields, err := parseFields(b)
	if err != nil {
		return d, err
	}
	for _, f := range fields {
		switch f.num {
		case 1:
			d.RequestNames = append(d.RequestNames, string(f.bytes))
		case 2:
			d.Pool = string(f.bytes)
		case 3:
			d.Device = string(f.bytes)
		case 4:
			d.CDIDeviceIDs = append(d.CDIDeviceIDs, string(f.bytes))
		case 5:
			s := string(f.bytes)
			d.ShareID = &s
		}
	}
	return d, nil
}

// decodeClaimMap reads map<string, NodePrepareResourceResponse> (prepare) or
// map<string, NodeUnprepareResourceResponse> (unprepare): field 1 of the response, one entry
// message {1: key, 2: value} per claim.
func decodeClaimMap(b []byte, prepare bool) (map[string]claimResult, error) {
	out := map[string]claimResult{}
	fields, err := parseFields(b)
	if err != nil {
		return nil, err
	}
	for _, f := range fields {
		if f.num != 1 || f.wire != wireBytes {
			continue
		}
		entry, err := parseFields(f.bytes)
		if err != nil {
			return nil, err
		}
		var key string
		var value []byte
		for _, e := range entry {
			switch e.num {
			case 1:
				key = string(e.bytes)
			case 2:
				value = e.bytes
			}
		}
		result := claimResult{}
		inner, err := parseFields(value)
		if err != nil {
			return nil, err
		}
		for _, v := range inner {
			switch {
			case prepare && v.num == 1:
				d, err := decodeDevice(v.bytes)
				if err != nil {
					return nil, err
				}
				result.Devices = append(result.Devices, d)
			case prepare && v.num == 2, !prepare && v.num == 1:
				result.Error = string(v.bytes)
			}
		}
		if _, dup := out[key]; dup {
			return nil, fmt.Errorf("claim %q answered twice", key)
		}
		out[key] = result
	}
	return out, nil
}

type deviceHealth struct {
	Pool                      string `json:"pool"`
	Device                    string `json:"device"`
	Health                    string `json:"health"`
	LastUpdatedTime           int64  `json:"last_updated_time"`
	HealthCheckTimeoutSeconds int64  `json:"health_check_timeout_seconds"`
	Message                   string `json:"message,omitempty"`
}

var healthNames = map[uint64]string{0: "UNKNOWN", 1: "HEALTHY", 2: "UNHEALTHY"}

func enumName(names map[uint64]string, v uint64) string {
	if n, ok := names[v]; ok {
		return n
	}
	return fmt.Sprintf("%d", v)
}

func decodeWatchResponse(b []byte) ([]deviceHealth, error) {
	out := []deviceHealth{}
	fields, err := parseFields(b)
	if err != nil {
		return nil, err
	}
	for _, f := range fields {
		if f.num != 1 {
			continue
		}
		h := deviceHealth{Health: "UNKNOWN"}
		inner, err := parseFields(f.bytes)
		if err != nil {
			return nil, err
		}
		for _, v := range inner {
			switch v.num {
			case 1:
				id, err := parseFields(v.bytes)
				if err != nil {
					return nil, err
				}
				for _, i := range id {
					switch i.num {
					case 1:
						h.Pool = string(i.bytes)
					case 2:
						h.Device = string(i.bytes)
					}
				}
			case 2:
				h.Health = enumName(healthNames, v.varint)
			case 3:
				h.LastUpdatedTime = int64(v.varint)
			case 4:
				h.HealthCheckTimeoutSeconds = int64(v.varint)
			case 5:
				h.Message = string(v.bytes)
			}
		}
		out = append(out, h)
	}
	return out, nil
}

var servingNames = map[uint64]string{0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}

// --- output ---

type step map[string]interface{}

var outMu sync.Mutex

func emit(s step) {
	outMu.Lock()
	defer outMu.Unlock()
	line, err := json.Marshal(s)
	if err != nil {
		line, _ = json.Marshal(step{"step": "InternalError", "message": err.Error()})
	}
	fmt.Println(string(line))
}

// withStatus adds the call's status, and its header and trailer metadata when it failed, so the
// test log shows how the server's error came through to grpc-go.
func withStatus(s step, err error, header, trailer metadata.MD, elapsed time.Duration) step {
	st, _ := status.FromError(err)
	s["code"] = st.Code().String()
	s["message"] = st.Message()
	s["elapsed_ms"] = elapsed.Milliseconds()
	if err != nil {
		s["header"] = header
		s["trailer"] = trailer
	}
	return s
}

// --- the calls ---

type result struct {
	reply           []byte
	err             error
	header, trailer metadata.MD
	elapsed         time.Duration
}

func invoke(ctx context.Context, conn *grpc.ClientConn, method string, request []byte,
	timeout time.Duration) result {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var r result
	start := time.Now()
	err := conn.Invoke(ctx, method, &request, &r.reply, grpc.ForceCodec(rawCodec{}),
		grpc.Header(&r.header), grpc.Trailer(&r.trailer))
	r.err, r.elapsed = err, time.Since(start)
	return r
}

func unixDialer(ctx context.Context, path string) (net.Conn, error) {
	return (&net.Dialer{}).DialContext(ctx, "unix", path)
}

type client struct {
	registrationSocket string
	claims             []claimRef
	pause              bool
	idleCloseWait      time.Duration
	stdin              *bufio.Reader
}

// waitForTest lets the test look at the node between steps: it announces the pause and blocks
// until the test writes a line.
func (c *client) waitForTest(after, service string) error {
	if !c.pause {
		return nil
	}
	emit(step{"step": "Paused", "after": after, "service": service})
	if _, err := c.stdin.ReadString('\n'); err != nil {
		return fmt.Errorf("waiting for the test to continue: %w", err)
	}
	return nil
}

// register does what the kubelet's plugin watcher does with a new registration socket: a
// blocking dial by path through its own unix dialer (so :authority is the socket path), GetInfo,
// then NotifyRegistrationStatus.
func (c *client) register(ctx context.Context) (pluginInfo, error) {
	dialCtx, cancel := context.WithTimeout(ctx, registrationDialTimeout)
	defer cancel()
	conn, err := grpc.DialContext(dialCtx, c.registrationSocket, grpc.WithInsecure(),
		grpc.WithBlock(), grpc.WithContextDialer(unixDialer))
	if err != nil {
		emit(step{"step": "DialRegistration", "code": status.Code(err).String(), "message": err.Error()})
		return pluginInfo{}, err
	}
	defer conn.Close()

	r := invoke(ctx, conn, "/pluginregistration.Registration/GetInfo", nil, getInfoTimeout)
	s := withStatus(step{"step": "GetInfo"}, r.err, r.header, r.trailer, r.elapsed)
	var info pluginInfo
	if r.err == nil {
		info, err = decodePluginInfo(r.reply)
		if err != nil {
			s["decode_error"] = err.Error()
		}
		s["type"], s["name"], s["endpoint"] = info.Type, info.Name, info.Endpoint
		s["supported_versions"] = info.SupportedVersions
	}
	emit(s)
	if r.err != nil {
		return info, r.err
	}
	if err != nil {
		return info, err
	}

	notify := appendBoolField(nil, 1, true)
	r = invoke(ctx, conn, "/pluginregistration.Registration/NotifyRegistrationStatus", notify,
		notifyTimeout)
	emit(withStatus(step{"step": "NotifyRegistrationStatus", "plugin_registered": true}, r.err,
		r.header, r.trailer, r.elapsed))
	return info, r.err
}

func (c *client) healthCheck(ctx context.Context, conn *grpc.ClientConn, label string) bool {
	// HealthCheckRequest{service: ""}: the empty message.
	r := invoke(ctx, conn, healthV1, nil, 10*time.Second)
	s := withStatus(step{"step": "HealthCheck", "label": label}, r.err, r.header, r.trailer,
		r.elapsed)
	ok := false
	if r.err == nil {
		fields, err := parseFields(r.reply)
		if err != nil {
			s["decode_error"] = err.Error()
		}
		st := uint64(0)
		for _, f := range fields {
			if f.num == 1 {
				st = f.varint
			}
		}
		s["status"] = enumName(servingNames, st)
		ok = st == 1
	}
	emit(s)
	return ok
}

// prepareRound sends one call per claim, all at once on the one connection, as the kubelet's
// pod workers do for pods that start together; each call has the kubelet's deadline.
func (c *client) prepareRound(ctx context.Context, conn *grpc.ClientConn, service, prefix,
	method string) {
	prepare := method == "NodePrepareResources"
	results := make([]result, len(c.claims))
	var wg sync.WaitGroup
	for i := range c.claims {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			results[i] = invoke(ctx, conn, prefix+method, encodeClaims(c.claims[i:i+1]),
				draCallTimeout)
		}(i)
	}
	wg.Wait()
	for i, r := range results {
		s := withStatus(step{"step": method, "service": service, "uid": c.claims[i].UID}, r.err,
			r.header, r.trailer, r.elapsed)
		if r.err == nil {
			claims, err := decodeClaimMap(r.reply, prepare)
			if err != nil {
				s["decode_error"] = err.Error()
			}
			s["claims"] = claims
		}
		emit(s)
	}
}

// watchHealth opens the health stream through `method` as a kubelet with the ResourceHealthStatus
// gate does, reports the first message, then cancels the stream (the kubelet does on
// de-registration) and reports how the stream ended; every step names `service`.
func (c *client) watchHealth(ctx context.Context, conn *grpc.ClientConn, service, method string) {
	streamCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var header, trailer metadata.MD
	desc := &grpc.StreamDesc{StreamName: "NodeWatchResources", ServerStreams: true}
	start := time.Now()
	stream, err := conn.NewStream(streamCtx, desc, method, grpc.ForceCodec(rawCodec{}),
		grpc.Header(&header), grpc.Trailer(&trailer))
	if err == nil {
		request := []byte{}
		err = stream.SendMsg(&request)
	}
	if err == nil {
		err = stream.CloseSend()
	}
	if err != nil {
		emit(withStatus(step{"step": "NodeWatchResources", "service": service}, err, header, trailer,
			time.Since(start)))
		return
	}
	// No deadline on the stream itself (the kubelet sets none); a timer that cancels bounds the
	// wait for the first message, and a timer that already fired tells that case apart.
	timer := time.AfterFunc(firstHealthMessageTimeout, cancel)
	var first []byte
	err = stream.RecvMsg(&first)
	timedOut := !timer.Stop()
	s := withStatus(step{"step": "NodeWatchResources", "service": service}, err, header, trailer,
		time.Since(start))
	s["timed_out"] = timedOut
	if err == nil {
		devices, derr := decodeWatchResponse(first)
		if derr != nil {
			s["decode_error"] = derr.Error()
		}
		s["devices"] = devices
	}
	emit(s)
	if err != nil {
		return
	}

	cancel()
	after := 0
	start = time.Now()
	for {
		var msg []byte
		if err = stream.RecvMsg(&msg); err != nil {
			break
		}
		after++ // a message that was already on its way
	}
	s = withStatus(step{"step": "NodeWatchResourcesCancelled", "service": service,
		"messages_after_cancel": after}, err, header, trailer, time.Since(start))
	emit(s)
}

// oddCalls sends what a kubelet of another version, or a broken one, could send: methods the
// plugin does not have, a body that is not protobuf, deadlines too short to be met.
func (c *client) oddCalls(ctx context.Context, conn *grpc.ClientConn) {
	report := func(name, method string, request []byte, timeout time.Duration) {
		r := invoke(ctx, conn, method, request, timeout)
		s := withStatus(step{"step": name, "method": method, "timeout_ms": timeout.Milliseconds()},
			r.err, r.header, r.trailer, r.elapsed)
		if r.err == nil {
			claims, err := decodeClaimMap(r.reply, strings.HasSuffix(method, "/NodePrepareResources"))
			if err != nil {
				s["decode_error"] = err.Error()
			}
			s["claims"] = claims
		}
		emit(s)
	}
	report("UnknownMethod", draV1+"NoSuchMethod", nil, 10*time.Second)
	report("UnknownService", "/no.such.v1.Service/Method", nil, 10*time.Second)
	// Field 1 (claims) announces 5 bytes and carries 1.
	report("MalformedRequest", draV1+"NodePrepareResources", []byte{0x0a, 0x05, 0x01}, 10*time.Second)
	if len(c.claims) > 0 {
		claim := encodeClaims(c.claims[:1])
		// Far below what the plugin keeps for its answer, and so short that the call may end
		// before the plugin has read it: either way the plugin must go on serving.
		report("ShortDeadline", draV1+"NodePrepareResources", claim, 300*time.Millisecond)
		report("ExpiringDeadline", draV1+"NodePrepareResources", claim, time.Millisecond)
		// Whatever the short calls left behind is undone as the kubelet would: by unprepare.
		report("UnprepareAfterShortDeadlines", draV1+"NodeUnprepareResources", claim, draCallTimeout)
	}
}

func (c *client) run() error {
	ctx := context.Background()
	info, err := c.register(ctx)
	if err != nil {
		return err
	}
	// One connection for everything, as a 1.34+ kubelet keeps one per plugin instance; dialled
	// by "unix:" target as that kubelet does (so :authority is "localhost").
	conn, err := grpc.DialContext(ctx, "unix:"+info.Endpoint, grpc.WithInsecure())
	if err != nil {
		emit(step{"step": "DialDRA", "code": status.Code(err).String(), "message": err.Error()})
		return err
	}
	defer conn.Close()
	c.healthCheck(ctx, conn, "first")
	if c.idleCloseWait > 0 {
		return c.acrossIdleClose(ctx, conn)
	}

	for _, api := range []struct{ service, prefix string }{
		{"v1.DRAPlugin", draV1}, {"v1beta1.DRAPlugin", draV1beta1}} {
		c.prepareRound(ctx, conn, api.service, api.prefix, "NodePrepareResources")
		if err := c.waitForTest("NodePrepareResources", api.service); err != nil {
			return err
		}
		c.prepareRound(ctx, conn, api.service, api.prefix, "NodeUnprepareResources")
		if err := c.waitForTest("NodeUnprepareResources", api.service); err != nil {
			return err
		}
	}
	// A 1.37+ kubelet watches v1, older ones v1alpha1: both streams, when advertised, one after
	// the other on the one connection.
	for _, h := range []struct{ service, method string }{
		{"v1.DRAResourceHealth", watchV1}, {"v1alpha1.DRAResourceHealth", watchAlpha}} {
		if slices.Contains(info.SupportedVersions, h.service) {
			c.watchHealth(ctx, conn, h.service, h.method)
		}
	}
	c.oddCalls(ctx, conn)
	// Still serving after all of the above.
	c.healthCheck(ctx, conn, "last")
	emit(step{"step": "Done"})
	return nil
}

// acrossIdleClose waits, with no call open, for the plugin to close the idle connection (the
// ClientConn leaves READY), then prepares and unprepares the claims on the same ClientConn, as
// the kubelet would on its next pod: grpc-go reconnects by itself.
func (c *client) acrossIdleClose(ctx context.Context, conn *grpc.ClientConn) error {
	start := time.Now()
	before := conn.GetState()
	waitCtx, cancel := context.WithTimeout(ctx, c.idleCloseWait)
	left := conn.WaitForStateChange(waitCtx, connectivity.Ready)
	cancel()
	emit(step{"step": "IdleClose", "state_before": before.String(), "left_ready": left,
		"state_after": conn.GetState().String(), "elapsed_ms": time.Since(start).Milliseconds()})
	c.healthCheck(ctx, conn, "after-idle-close")
	c.prepareRound(ctx, conn, "v1.DRAPlugin", draV1, "NodePrepareResources")
	c.prepareRound(ctx, conn, "v1.DRAPlugin", draV1, "NodeUnprepareResources")
	emit(step{"step": "Done"})
	return nil
}

type claimFlags []claimRef

func (f *claimFlags) String() string { return fmt.Sprint(*f) }

func (f *claimFlags) Set(v string) error {
	parts := strings.Split(v, "/")
	if len(parts) != 3 {
		return fmt.Errorf("%q is not namespace/name/uid", v)
	}
	*f = append(*f, claimRef{Namespace: parts[0], Name: parts[1], UID: parts[2]})
	return nil
}

func main() {
	c := &client{stdin: bufio.NewReader(os.Stdin)}
	var claims claimFlags
	flag.StringVar(&c.registrationSocket, "registration-socket", "",
		"the plugin's registration socket (<registrar-dir>/<driver>-reg.sock)")
	flag.Var(&claims, "claim", "namespace/name/uid of an allocated claim to prepare (repeatable)")
	flag.BoolVar(&c.pause, "pause", false,
		"after each prepare and unprepare round, print a Paused step and wait for a line on stdin")
	flag.DurationVar(&c.idleCloseWait, "idle-close-wait", 0,
		"instead of the full run: after the first health check, wait up to this long for the "+
			"plugin to close the idle connection, then prepare and unprepare the claims")
	flag.Parse()
	if c.registrationSocket == "" {
		fmt.Fprintln(os.Stderr, "--registration-socket is required")
		os.Exit(2)
	}
	c.claims = claims
	if err := c.run(); err != nil {
		fmt.Fprintln(os.Stderr, "kubelet-grpcgo-client:", err)
		os.Exit(1)
	}
}
