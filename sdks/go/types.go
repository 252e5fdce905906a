package cronoq

import (
	"strconv"
	"strings"
	"time"

	pb "github.com/synaptiai/cronoq/sdks/go/cronoqpb"
)

// Priority is a task's priority class. The zero value means Normal.
type Priority int32

// Priority classes, most urgent first. The values are the wire enum's.
const (
	Critical Priority = Priority(pb.Priority_PRIORITY_CRITICAL)
	High     Priority = Priority(pb.Priority_PRIORITY_HIGH)
	Normal   Priority = Priority(pb.Priority_PRIORITY_NORMAL)
	Low      Priority = Priority(pb.Priority_PRIORITY_LOW)
)

// String is the lower-case class name, or "unspecified" for the zero value.
func (p Priority) String() string {
	return enumName(pb.Priority(p).String(), "PRIORITY_")
}

// wire sends Normal explicitly for the zero value, as the Python client does, so a server
// default can never silently differ from what the caller sees.
func (p Priority) wire() pb.Priority {
	if p == 0 {
		return pb.Priority_PRIORITY_NORMAL
	}
	return pb.Priority(p)
}

// Status is where a task is in its life cycle.
type Status int32

// Task statuses. The values are the wire enum's; Succeeded and everything after it are
// terminal.
const (
	Blocked      Status = Status(pb.TaskStatus_TASK_STATUS_BLOCKED)
	Scheduled    Status = Status(pb.TaskStatus_TASK_STATUS_SCHEDULED)
	Ready        Status = Status(pb.TaskStatus_TASK_STATUS_READY)
	Running      Status = Status(pb.TaskStatus_TASK_STATUS_RUNNING)
	Retrying     Status = Status(pb.TaskStatus_TASK_STATUS_RETRYING)
	Succeeded    Status = Status(pb.TaskStatus_TASK_STATUS_SUCCEEDED)
	Failed       Status = Status(pb.TaskStatus_TASK_STATUS_FAILED)
	DeadLettered Status = Status(pb.TaskStatus_TASK_STATUS_DEAD_LETTERED)
	Cancelled    Status = Status(pb.TaskStatus_TASK_STATUS_CANCELLED)
	Skipped      Status = Status(pb.TaskStatus_TASK_STATUS_SKIPPED)
	Missed       Status = Status(pb.TaskStatus_TASK_STATUS_MISSED)
	Shed         Status = Status(pb.TaskStatus_TASK_STATUS_SHED)
)

// Done reports whether the status is terminal: the task will not change any more.
func (s Status) Done() bool { return s >= Succeeded && s <= Shed }

// String is the lower-case status name, such as "dead_lettered".
func (s Status) String() string {
	return enumName(pb.TaskStatus(s).String(), "TASK_STATUS_")
}

// enumName strips the wire prefix and lower-cases; numbers unknown to these stubs (from a
// newer server) stay readable as their number instead of failing.
func enumName(name, prefix string) string {
	if trimmed, ok := strings.CutPrefix(name, prefix); ok {
		return strings.ToLower(trimmed)
	}
	return name
}

// Cond is the condition of a dependency edge. The zero value means OnSuccess.
type Cond int32

// Dependency conditions.
const (
	// OnSuccess lets the dependent run once the parent succeeded.
	OnSuccess Cond = Cond(pb.EdgeCond_EDGE_COND_ON_SUCCESS)
	// OnComplete lets it run once the parent ended, whatever the outcome.
	OnComplete Cond = Cond(pb.EdgeCond_EDGE_COND_ON_COMPLETE)
	// OnFailure lets it run once the parent ended without succeeding.
	OnFailure Cond = Cond(pb.EdgeCond_EDGE_COND_ON_FAILURE)
)

func (c Cond) wire() pb.EdgeCond {
	if c == 0 {
		return pb.EdgeCond_EDGE_COND_ON_SUCCESS
	}
	return pb.EdgeCond(c)
}

// Ref names one task, by id or by idempotency key. Make one with ID or Key.
type Ref struct {
	id    uint64
	key   string
	byKey bool
}

// ID refers to a task by its id.
func ID(id uint64) Ref { return Ref{id: id} }

// Key refers to a task by its idempotency key.
func Key(key string) Ref { return Ref{key: key, byKey: true} }

func (r Ref) String() string {
	if r.byKey {
		return strconv.Quote(r.key)
	}
	return strconv.FormatUint(r.id, 10)
}

func (r Ref) wire() *pb.TaskRef {
	if r.byKey {
		return &pb.TaskRef{Target: &pb.TaskRef_Key{Key: r.key}}
	}
	return &pb.TaskRef{Target: &pb.TaskRef_Id{Id: r.id}}
}

// Dep is a dependency on another task.
type Dep struct {
	Ref  Ref
	Cond Cond
}

// Task is everything a client says about a task when submitting it. Zero values mean "not
// given": the server's or the pool's default applies.
type Task struct {
	// Payload is handed to the worker unchanged; ContentType describes it.
	Payload     []byte
	ContentType string
	// Kind is a free-form task type for workers and listings.
	Kind string
	// Pool is the target pool; empty means the server's default pool.
	Pool string
	// Key is an idempotency key: submitting a key that is live or still retained returns the
	// existing task (Submitted.Duplicate).
	Key string
	// Tenant is the fair-share tenant.
	Tenant   string
	Priority Priority
	// Timeout bounds each attempt.
	Timeout time.Duration
	// Deadline is a soft deadline relative to submission; it raises urgency as it nears.
	Deadline time.Duration
	// StartIn delays the task's start by this much.
	StartIn time.Duration
	// After lists the tasks this one depends on.
	After []Dep
	// Resources is the amount needed of each named resource.
	Resources map[string]uint32
	// Tags are user metadata handed to the worker.
	Tags map[string]string
	// Traceparent and Tracestate set the task's W3C trace context explicitly: they become
	// its tags "traceparent" and "tracestate" unless Tags has a "traceparent" of its own.
	// Empty means the trace context of Submit's context (see Client.Submit).
	Traceparent, Tracestate string
	// Labels are worker labels the task requires: it runs only on workers that have them all.
	Labels map[string]string
	// MaxAttempts, when set, replaces the pool's retry policy with this many attempts (the
	// first included) and the server's default backoff.
	MaxAttempts uint32
}

func seconds(d time.Duration) *float64 {
	s := d.Seconds()
	return &s
}

func (t *Task) wire() *pb.TaskSpec {
	spec := &pb.TaskSpec{
		Payload:     t.Payload,
		ContentType: t.ContentType,
		Kind:        t.Kind,
		Pool:        t.Pool,
		Key:         t.Key,
		Tenant:      t.Tenant,
		Priority:    t.Priority.wire(),
		Resources:   t.Resources,
		Tags:        t.Tags,
		Labels:      t.Labels,
	}
	if t.Timeout > 0 {
		spec.TimeoutS = seconds(t.Timeout)
	}
	if t.Deadline > 0 {
		spec.DeadlineInS = seconds(t.Deadline)
	}
	if t.StartIn > 0 {
		spec.StartInS = seconds(t.StartIn)
	}
	if t.MaxAttempts > 0 {
		// Zero backoff fields ask for the server's defaults; jitter matches the default policy.
		spec.Retry = &pb.RetryPolicy{MaxAttempts: t.MaxAttempts, Jitter: true}
	}
	for _, d := range t.After {
		spec.Deps = append(spec.Deps, &pb.Dep{Target: d.Ref.wire(), Cond: d.Cond.wire()})
	}
	return spec
}

// Submitted is the answer to Submit.
type Submitted struct {
	ID uint64
	// Duplicate is true when Key named an existing task; ID is that task's.
	Duplicate bool
}

// TaskInfo is the state of one task. Times are zero when unknown.
type TaskInfo struct {
	ID     uint64
	Status Status
	Pool   string
	Key    string
	Kind   string
	Tenant string
	// Priority is 0 when the server does not know it.
	Priority Priority
	// Attempt is the latest attempt's number, 0 before the first.
	Attempt uint32
	// MaxAttempts is 0 when unknown.
	MaxAttempts uint32
	Created     time.Time
	Started     time.Time
	Finished    time.Time
	// Message is the last error or status message.
	Message string
	// OutputAvailable says the output is still held and Wait can return it.
	OutputAvailable bool
}

func unixNano(ns *int64) time.Time {
	if ns == nil {
		return time.Time{}
	}
	return time.Unix(0, *ns)
}

func taskInfo(m *pb.TaskInfo) TaskInfo {
	return TaskInfo{
		ID:              m.GetId(),
		Status:          Status(m.GetStatus()),
		Pool:            m.GetPool(),
		Key:             m.GetKey(),
		Kind:            m.GetKind(),
		Tenant:          m.GetTenant(),
		Priority:        Priority(m.GetPriority()),
		Attempt:         m.GetAttempt(),
		MaxAttempts:     m.GetMaxAttempts(),
		Created:         unixNano(m.CreatedUnixNs),
		Started:         unixNano(m.StartedUnixNs),
		Finished:        unixNano(m.FinishedUnixNs),
		Message:         m.GetMessage(),
		OutputAvailable: m.GetOutputAvailable(),
	}
}

// Result is how a task ended.
type Result struct {
	ID     uint64
	Status Status
	// Output is nil when the task did not succeed or its output is no longer held; a task that
	// succeeded with an empty output has a non-nil empty Output.
	Output  []byte
	Message string
	// OutputAvailable says the server still holds the output.
	OutputAvailable bool
}

// OK reports whether the task succeeded.
func (r Result) OK() bool { return r.Status == Succeeded }

func result(m *pb.TaskResult) Result {
	r := Result{
		ID:              m.GetId(),
		Status:          Status(m.GetStatus()),
		Message:         m.GetMessage(),
		OutputAvailable: m.GetOutputAvailable(),
	}
	if m.Output != nil {
		r.Output = append([]byte{}, m.Output...)
	}
	return r
}

// ListOptions selects the tasks of one List page. Empty filters match everything.
type ListOptions struct {
	Pools    []string
	Statuses []Status
	// After is the previous page's NextAfter (0 for the first page).
	After uint64
	// Limit is the page size; 0 means the server's default.
	Limit uint32
}

// TaskPage is one page of tasks, ordered by id.
type TaskPage struct {
	Tasks []TaskInfo
	// NextAfter is the cursor for the next page; 0 on the last page.
	NextAfter uint64
	// UnavailableShards names shards that did not answer; their tasks are missing.
	UnavailableShards []string
}

// WatchOptions selects the events of a Watch. Empty filters match everything.
type WatchOptions struct {
	Pools []string
	IDs   []uint64
	Keys  []string
	// AllTransitions asks for every status change, not only the terminal ones.
	AllTransitions bool
}

// Event is one status change of one task.
type Event struct {
	ID      uint64
	Pool    string
	Key     string
	Status  Status
	Attempt uint32
	At      time.Time
	Message string
}
