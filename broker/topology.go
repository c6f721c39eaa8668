package broker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hopper-sidecar/hopper/topology"
)

// ErrTopology marks a topology that is missing or does not match the plan.
var ErrTopology = errors.New("topology mismatch")

// Declare declares every queue the plan owns (durable, with its arguments)
// and checks that the work queue exists when it is the operator's; then the
// exchanges (an existing one of another type is an error, never replaced)
// and the bindings to the work queue.
func Declare(ctx context.Context, conn *amqp.Connection, p *topology.Plan) error {
	var errs []error
	for _, q := range p.Queues() {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !q.Owned {
			if err := exists(conn, q.Name); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if q.Role == topology.RoleTier {
			if err := declareTier(conn, p, q); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if err := declare(conn, q); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...) // no bindings to a queue that is not there
	}
	if err := requireExchangeTypes(conn, p); err != nil {
		return err
	}
	for _, e := range p.Exchanges {
		if err := declareExchange(conn, e, true); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	for _, b := range p.Bindings {
		if err := bind(conn, b); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Verify checks, without creating anything, that every queue exists and
// that Hopper's own queues have the planned arguments. (For partitions,
// the check that the broker knows the consistent-hash type declares a
// throwaway exchange and deletes it at once: see requireExchangeTypes.)
func Verify(ctx context.Context, conn *amqp.Connection, p *topology.Plan) error {
	var errs []error
	for _, q := range p.Queues() {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if q.Role == topology.RoleTier && q.Successor != "" && exists(conn, q.Successor) == nil {
			if err := declareSuccessor(conn, p, q); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if err := exists(conn, q.Name); err != nil {
			errs = append(errs, err)
			continue
		}
		if q.Role == topology.RoleWork {
			// The operator's queue: its arguments are theirs, but for the
			// ones the config asks for, and its type must be the one the
			// config says, since Hopper hands messages back differently
			// to a quorum queue.
			if err := verifyType(ctx, conn, q); err != nil {
				errs = append(errs, err)
				continue
			}
			if err := verifyWork(conn, q); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if q.Role == topology.RoleTier {
			if err := verifyTier(conn, p, q); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		// The queue exists, so an active declare creates nothing; the broker
		// answers PRECONDITION_FAILED when the arguments differ.
		if err := declare(conn, q); err != nil {
			errs = append(errs, err)
		}
	}
	if err := requireExchangeTypes(conn, p); err != nil {
		return errors.Join(append(errs, err)...)
	}
	// Exchanges must exist with the planned type. Bindings cannot be read
	// over AMQP 0-9-1, so they are the operator's to check.
	for _, e := range p.Exchanges {
		if err := declareExchange(conn, e, false); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// declareExchange declares e (create=true) or checks that it exists. An
// exchange that exists is then declared actively with the planned type and
// durability, which creates nothing and makes the broker refuse a
// mismatch. The broker's own amq.* exchanges are only checked to exist.
func declareExchange(conn *amqp.Connection, e topology.Exchange, create bool) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer closeQuietly(ch)
	if !create || !e.Owned {
		if err := ch.ExchangeDeclarePassive(e.Name, e.Type, e.Durable, false, false, false, nil); err != nil {
			return fmt.Errorf("%w: exchange %q does not exist: %w", ErrTopology, e.Name, err)
		}
		if !e.Owned {
			return nil
		}
	}
	// autoDelete=false, internal=false, noWait=false
	if err := ch.ExchangeDeclare(e.Name, e.Type, e.Durable, false, false, false, amqp.Table(e.Args)); err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
			return fmt.Errorf("%w: exchange %q exists with another type, durability or arguments than planned (type=%s durable=%t arguments=%v); change the config, or delete the exchange: %w",
				ErrTopology, e.Name, e.Type, e.Durable, e.Args, err)
		}
		return fmt.Errorf("declare exchange %q: %w", e.Name, err)
	}
	return nil
}

// ErrPluginMissing marks an exchange type the broker does not know: the
// plugin that provides it is not enabled.
var ErrPluginMissing = errors.New("broker plugin not enabled")

// EnableConsistentHash is the command that gives the broker the
// consistent-hash exchange type partitions need.
const EnableConsistentHash = "rabbitmq-plugins enable rabbitmq_consistent_hash_exchange"

// requireExchangeTypes checks that the broker knows the consistent-hash
// exchange type before anything of the plan's exchanges is declared. An
// unknown type makes the broker close the channel (or connection) with a
// bare "unknown exchange type": the operator is told instead which plugin
// to enable. The check declares a throwaway exchange of the type and
// deletes it, since an existing exchange is accepted by a passive declare
// even after its plugin was disabled.
func requireExchangeTypes(conn *amqp.Connection, p *topology.Plan) error {
	if !p.Partitioned() {
		return nil
	}
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer closeQuietly(ch)
	name := "hopper.type-check." + strconv.FormatInt(time.Now().UnixNano(), 36)
	// durable=false, autoDelete=true, internal=false, noWait=false
	if err := ch.ExchangeDeclare(name, topology.ConsistentHash, false, true, false, false, nil); err != nil {
		if unknownExchangeType(err) {
			return fmt.Errorf("%w: %w: exchange type %s is unknown to the broker (partitions need it); enable it on every node with `%s`: %w",
				ErrTopology, ErrPluginMissing, topology.ConsistentHash, EnableConsistentHash, err)
		}
		return fmt.Errorf("check exchange type %s: %w", topology.ConsistentHash, err)
	}
	if err := ch.ExchangeDelete(name, false, false); err != nil { // ifUnused=false, noWait=false
		return fmt.Errorf("delete exchange %q after checking its type: %w", name, err)
	}
	return nil
}

// unknownExchangeType reports the broker's refusal of an exchange type no
// plugin provides: COMMAND_INVALID on RabbitMQ 3.x, PRECONDITION_FAILED
// naming the type on 4.x.
func unknownExchangeType(err error) bool {
	var ae *amqp.Error
	if !errors.As(err, &ae) {
		return false
	}
	return ae.Code == amqp.CommandInvalid ||
		ae.Code == amqp.PreconditionFailed && strings.Contains(ae.Reason, "unknown exchange type")
}

// bind binds the work queue (or, for an exchange-to-exchange binding, the
// destination exchange); binding twice is a no-op for the broker.
func bind(conn *amqp.Connection, b topology.Binding) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer closeQuietly(ch)
	if b.ToExchange != "" {
		if err := ch.ExchangeBind(b.ToExchange, b.RoutingKey, b.Exchange, false, amqp.Table(b.Args)); err != nil { // noWait=false
			return fmt.Errorf("bind exchange %q to exchange %q (routing key %q): %w", b.ToExchange, b.Exchange, b.RoutingKey, err)
		}
		return nil
	}
	if err := ch.QueueBind(b.Queue, b.RoutingKey, b.Exchange, false, amqp.Table(b.Args)); err != nil { // noWait=false
		return fmt.Errorf("bind queue %q to exchange %q (routing key %q): %w", b.Queue, b.Exchange, b.RoutingKey, err)
	}
	return nil
}

// exists is a passive declare on a throwaway channel (a failed passive
// declare closes the channel it ran on).
func exists(conn *amqp.Connection, name string) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer closeQuietly(ch)
	if _, err := declarePassive(ch, name); err != nil {
		return fmt.Errorf("%w: queue %q does not exist: %w", ErrTopology, name, err)
	}
	return nil
}

// declare declares q (or, for a queue that exists, makes the broker check
// its arguments). An Unbounded queue gets x-delivery-limit -1 where the
// broker reads it as no limit (see unlimitedDeliveries); a queue that exists
// without it, declared before Hopper added it, is accepted as it is, since
// its arguments cannot change without deleting it.
func declare(conn *amqp.Connection, q topology.Queue) error {
	if q.Unbounded {
		if v, ok := unlimitedDeliveries(serverVersion(conn)); ok {
			args := maps.Clone(q.Args)
			args[argDeliveryLimit] = v
			err := declareWith(conn, q, args)
			var ae *amqp.Error
			if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed {
				return err
			}
		}
	}
	return declareWith(conn, q, q.Args)
}

const argDeliveryLimit = "x-delivery-limit"

// unlimitedDeliveries is the x-delivery-limit that lifts a quorum queue's
// delivery limit on a broker of that version: -1 on RabbitMQ 4.x and later,
// where a negative limit means none and an absent one means 20; nothing on
// 3.x (or an unknown version), which has no limit unless one is set and
// drops a message at its first return under -1.
func unlimitedDeliveries(version string) (int32, bool) {
	major, _, _ := strings.Cut(version, ".")
	n, err := strconv.Atoi(major)
	if err != nil || n < 4 {
		return 0, false
	}
	return -1, true
}

// serverVersion is the broker's version as it announced it.
func serverVersion(conn *amqp.Connection) string {
	v, _ := conn.Properties["version"].(string)
	return v
}

// verifyType checks that an operator's queue is of the type the plan
// says (queue.type): a quorum queue taken for a classic one would get its
// messages handed back by returning them, which spends its delivery limit.
func verifyType(ctx context.Context, conn *amqp.Connection, q topology.Queue) error {
	want, _ := q.Args["x-queue-type"].(string)
	if want == "" {
		return nil
	}
	got, err := queueType(ctx, conn, q.Name)
	if err != nil {
		return fmt.Errorf("%w: %s queue %q: %w", ErrTopology, q.Role, q.Name, err)
	}
	if string(got) != want {
		return fmt.Errorf("%w: %s queue %q is a %s queue, the config says %s: set queue.type: %s (Hopper hands messages back to a quorum queue by republishing them, so that its delivery limit is not spent)",
			ErrTopology, q.Role, q.Name, got, want, got)
	}
	return nil
}

// DeliveryLimitNotes says, for each queue of the plan that is a quorum queue
// Hopper did not declare, that on RabbitMQ 4.x it has a delivery limit
// Hopper cannot read (20 returns unless an x-delivery-limit argument or a
// policy sets another). Hopper never spends it on a message the app did not
// process, but other clients of the queue, or an operator's policy, may
// set it low; AMQP 0-9-1 shows neither arguments nor policies, so this is
// said once at start, for the operator to check. Nothing is noted on 3.x,
// where a quorum queue has no limit unless one is set.
func DeliveryLimitNotes(ctx context.Context, o Options, p *topology.Plan) ([]string, error) {
	conn, _, err := o.dialOnce(ctx, 0)
	if err != nil {
		return nil, fmt.Errorf("connect to broker: %w", err)
	}
	defer conn.Close()
	version := serverVersion(conn)
	if _, four := unlimitedDeliveries(version); !four {
		return nil, nil
	}
	var notes []string
	for _, q := range p.Queues() {
		if q.Owned {
			continue
		}
		t, err := queueType(ctx, conn, q.Name)
		if err != nil {
			return notes, err
		}
		if t != Quorum {
			continue
		}
		notes = append(notes, fmt.Sprintf("%s queue %q is a quorum queue Hopper did not declare: RabbitMQ %s drops (or dead-letters) a message returned more often than its delivery limit, 20 unless an x-delivery-limit argument or a policy sets another, which Hopper cannot read; Hopper itself never returns a message it did not deliver to the app",
			q.Role, q.Name, version))
	}
	return notes, nil
}

// verifyWork checks the arguments of an operator's work queue that the
// config asks for (queue.arguments, queue.singleActiveConsumer), and that
// the queue is not a single-active-consumer queue the config does not ask
// for, since one consumer at a time changes how the pods share the work.
//
// AMQP 0-9-1 cannot read a queue's arguments. An active declare of a queue
// that exists creates nothing, and the broker refuses it (406
// PRECONDITION_FAILED) at the first argument it compares that differs from
// the queue's, naming the argument and the queue's value of it. So the
// check declares with the asked-for arguments; when the broker names one of
// those, or single active consumer, that is the mismatch. When it names an
// argument the config does not speak of (a dead-letter exchange the
// operator set, a length limit), its value is taken as the queue has it and
// the declare tried again, until the broker accepts or names an argument
// the config does ask for.
func verifyWork(conn *amqp.Connection, q topology.Queue) error {
	args := map[string]any{}
	for _, k := range q.Checked {
		args[k] = q.Args[k]
	}
	asked := func(k string) bool { return slices.Contains(q.Checked, k) || k == topology.ArgSingleActiveConsumer }
	for range maxArgRounds {
		err := passiveDeclareWith(conn, q.Name, args)
		var ae *amqp.Error
		if err == nil || !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed {
			return err
		}
		key, current, ok := inequivalentArg(ae.Reason)
		switch {
		case ok && asked(key):
			want := "none"
			if v, set := args[key]; set {
				want = fmt.Sprint(v)
			}
			return fmt.Errorf("%w: work queue %q has %s=%s, the config asks for %s (%s). A queue's arguments cannot change once it exists: "+
				"create the queue anew with the asked-for arguments (or move to a new queue name), or change %s to match it: %w",
				ErrTopology, q.Name, key, describeArg(current), want, configKey(key), configKey(key), err)
		case ok:
			args[key] = current // the operator's own argument
			if current == nil {
				delete(args, key)
			}
		default:
			if len(q.Checked) == 0 {
				return nil // nothing asked for; an argument Hopper cannot read is the operator's
			}
			return fmt.Errorf("%w: could not check the arguments of work queue %q (%s): %w", ErrTopology, q.Name, strings.Join(q.Checked, ", "), err)
		}
	}
	return fmt.Errorf("%w: could not check the arguments of work queue %q: the broker kept refusing after %d arguments", ErrTopology, q.Name, maxArgRounds)
}

// maxArgRounds bounds the declares one work queue check makes: one per
// argument the queue has that the config does not speak of.
const maxArgRounds = 32

// configKey names the config key that sets a work queue argument.
func configKey(arg string) string {
	if arg == topology.ArgSingleActiveConsumer {
		return "queue.singleActiveConsumer"
	}
	return "queue.arguments." + arg
}

func describeArg(v any) string {
	if v == nil {
		return "none"
	}
	return fmt.Sprint(v)
}

// inequivalentReason is how RabbitMQ words a declare whose argument differs
// from the queue's: "inequivalent arg 'K' for queue 'Q' in vhost 'V':
// received R but current is C", where C is none, 'true'/'false' for a
// boolean, or "the value 'X' of type 'T'".
var inequivalentReason = regexp.MustCompile(`inequivalent arg '([^']+)' for queue .*: received .* but current is (none|the value '(.*)' of type '([a-z]+)'|'(.*)')$`)

// inequivalentArg reads the argument the broker named and the queue's
// value of it (nil when the queue does not have it) from a refusal; ok is
// false when the reason is not one it knows how to read.
func inequivalentArg(reason string) (key string, current any, ok bool) {
	m := inequivalentReason.FindStringSubmatch(reason)
	if m == nil {
		return "", nil, false
	}
	key = m[1]
	val, typ := m[3], m[4]
	switch {
	case m[2] == "none":
		return key, nil, true
	case typ == "":
		// Of the type the declare sent: a boolean, an integer or a string.
		val = m[5]
		if val == "true" || val == "false" {
			return key, val == "true", true
		}
		if n, err := strconv.ParseInt(val, 10, 64); err == nil {
			return key, n, true
		}
		return key, val, true
	}
	switch typ {
	case "longstr":
		return key, val, true
	case "bool":
		return key, val == "true", true
	case "long", "signedint", "short", "byte", "unsignedbyte", "unsignedshort", "unsignedint":
		n, err := strconv.ParseInt(val, 10, 64)
		if err != nil {
			return key, nil, false
		}
		// The broker compares integers of any width alike.
		return key, n, true
	}
	return key, nil, false
}

// passiveDeclareWith declares an existing queue actively with args, which
// creates nothing when it exists and is refused when an argument differs.
// A queue that does not exist is reported, never created.
func passiveDeclareWith(conn *amqp.Connection, name string, args map[string]any) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer closeQuietly(ch)
	if _, err := declarePassive(ch, name); err != nil {
		return fmt.Errorf("%w: queue %q does not exist: %w", ErrTopology, name, err)
	}
	_, err = ch.QueueDeclare(name,
		true,  // durable
		false, // autoDelete
		false, // exclusive
		false, // noWait
		amqp.Table(args))
	return err
}

func declareWith(conn *amqp.Connection, q topology.Queue, args map[string]any) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer closeQuietly(ch)
	if _, err := ch.QueueDeclare(q.Name,
		true,  // durable
		false, // autoDelete
		false, // exclusive
		false, // noWait
		amqp.Table(args)); err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
			if key, current, ok := inequivalentArg(ae.Reason); ok && q.Role == topology.RoleWork &&
				(slices.Contains(q.Checked, key) || key == topology.ArgSingleActiveConsumer) {
				return fmt.Errorf("%w: work queue %q exists with %s=%s, the config asks for %s. A queue's arguments cannot change once it exists: "+
					"change %s to match the queue, or move to a new queue (a new queue.name, or drain and delete this one, then let Hopper declare it): %w",
					ErrTopology, q.Name, key, describeArg(current), describeArg(args[key]), configKey(key), err)
			}
			if q.Role == topology.RoleTier {
				if err := tierTypeChanged(conn, q, args, err); err != nil {
					return err
				}
			}
			if strings.Contains(ae.Reason, "inequivalent arg") {
				return fmt.Errorf("%w: %s queue %q exists with other arguments than planned (%v); delete it or change the config: %w",
					ErrTopology, q.Role, q.Name, q.Args, err)
			}
		}
		if errors.As(err, &ae) {
			// The broker refused the arguments themselves (a version it
			// no longer supports, a deprecated feature it no longer
			// permits): its own words say which.
			return fmt.Errorf("%w: the broker refused to declare %s queue %q with %v: %s: %w",
				ErrTopology, q.Role, q.Name, args, ae.Reason, err)
		}
		return fmt.Errorf("declare %s queue %q: %w", q.Role, q.Name, err)
	}
	return nil
}

// tierTypeError is a tier's declare refused because the tier exists with
// another queue type than planned.
type tierTypeError struct {
	name, got, want string
	err             error
}

func (e *tierTypeError) Error() string {
	return fmt.Sprintf("%v: delay tier %q exists as a %s queue, the config asks for a %s one (queue.tierType, queue.type). A queue's type cannot change once it exists: "+
		"leave queue.tierType out (Hopper then keeps the old tier handing back what it holds and sends new retries to a new tier), or "+
		"stop the Hopper processes of this queue, let the tier empty (its messages go back to the work queue when their delay runs out), delete it, and start them again: %v",
		ErrTopology, e.name, e.got, e.want, e.err)
}

func (e *tierTypeError) Unwrap() []error { return []error{ErrTopology, e.err} }

// tierTypeChanged explains a delay tier's refused declare when the tier
// exists with another queue type than planned (queue.tierType changed):
// the broker names the first argument that differs, seldom the type. It
// returns nil when the type is not what differs.
func tierTypeChanged(conn *amqp.Connection, q topology.Queue, args map[string]any, declareErr error) error {
	want, _ := args["x-queue-type"].(string)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := queueType(ctx, conn, q.Name)
	if err != nil || want == "" || string(got) == want {
		return nil
	}
	return &tierTypeError{name: q.Name, got: string(got), want: string(want), err: declareErr}
}

// declareTier declares the tier q of plan p, or the queue that succeeds
// it, and records on p which of the two takes its retries.
//
// A tier's type cannot change while it exists, so an upgrade that changes
// the tiers' default type meets tiers of the old type, possibly holding
// retries. Left to the default, such a tier is replaced in place when it
// is empty; otherwise it keeps handing back what it holds as each delay
// runs out (it needs no consumer for that), new retries go to its
// successor, and the old tier is deleted at a later declare once it reads
// empty. A successor once in use stays in use, so every process of the
// queue agrees on it whatever order they start in. A publisher still
// sending to a deleted tier has its copy returned as unroutable, a failed
// move it retries, never a lost message.
func declareTier(conn *amqp.Connection, p *topology.Plan, q topology.Queue) error {
	if q.Successor != "" && exists(conn, q.Successor) == nil {
		return declareSuccessor(conn, p, q)
	}
	err := declare(conn, q)
	var te *tierTypeError
	if !errors.As(err, &te) || p.TierTypeChosen || q.Successor == "" {
		if err == nil {
			p.UseTier(q.Delay, q.Name)
		}
		return err
	}
	if deleteIfEmpty(conn, q.Name) {
		if err := declare(conn, q); err != nil {
			return err
		}
		p.UseTier(q.Delay, q.Name)
		p.NoteTier(q.Name, fmt.Sprintf("delay tier %q was an empty %s queue: replaced by a %s one", q.Name, te.got, te.want))
		return nil
	}
	return declareSuccessor(conn, p, q)
}

// declareSuccessor declares q's successor, records it as the queue of q's
// delay, and deletes q itself if it is of another type and empty.
func declareSuccessor(conn *amqp.Connection, p *topology.Plan, q topology.Queue) error {
	s := q
	s.Name = q.Successor
	if err := declare(conn, s); err != nil {
		return err
	}
	p.UseTier(q.Delay, s.Name)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	want, _ := q.Args["x-queue-type"].(string)
	got, err := queueType(ctx, conn, q.Name)
	switch {
	case err != nil:
		// Gone: the successor is all there is.
		p.NoteTier(q.Name, fmt.Sprintf("delay tier %q: retries go to %q, which succeeded it", q.Name, s.Name))
	case string(got) != want && deleteIfEmpty(conn, q.Name):
		p.NoteTier(q.Name, fmt.Sprintf("delay tier %q: the old %s tier was empty and is deleted; retries go to %q", q.Name, got, s.Name))
	case string(got) != want:
		p.NoteTier(q.Name, fmt.Sprintf("delay tier %q is a %s queue an earlier setting declared: it hands back what it holds as each delay runs out, "+
			"new retries go to the %s queue %q, and it is deleted at a later start or reconnect once it reads empty", q.Name, got, want, s.Name))
	default:
		p.NoteTier(q.Name, fmt.Sprintf("delay tier %q: retries go to %q, which succeeded it", q.Name, s.Name))
	}
	return nil
}

// verifyTier checks a tier that the operator declared (topology.declare
// false). One of the other type than the default plans is kept, with a
// note, since Hopper may not replace the operator's queues; a type the
// config names is required.
func verifyTier(conn *amqp.Connection, p *topology.Plan, q topology.Queue) error {
	err := declare(conn, q)
	var te *tierTypeError
	if errors.As(err, &te) && !p.TierTypeChosen {
		p.UseTier(q.Delay, q.Name)
		p.NoteTier(q.Name, fmt.Sprintf("delay tier %q is a %s queue, Hopper's default is %s: kept as it is, since topology.declare is false; "+
			"a classic tier can drop a retry whose delay runs out while the broker stops. Declare it as a %s queue (or %q) to avoid that, "+
			"or set queue.tierType: %s to say the classic tier is meant", q.Name, te.got, te.want, te.want, q.Successor, te.got))
		return nil
	}
	if err == nil {
		p.UseTier(q.Delay, q.Name)
	}
	return err
}

// deleteIfEmpty deletes the queue name if it holds no message, and says
// whether it did. The broker checks emptiness and deletes in one step.
func deleteIfEmpty(conn *amqp.Connection, name string) bool {
	ch, err := conn.Channel()
	if err != nil {
		return false
	}
	defer closeQuietly(ch)
	_, err = ch.QueueDelete(name,
		false, // ifUnused
		true,  // ifEmpty
		false) // noWait
	return err == nil
}

// declarePassive checks that a durable queue exists, creating nothing. A
// failure closes ch (the broker closes the channel on a 404).
func declarePassive(ch *amqp.Channel, name string) (amqp.Queue, error) {
	return ch.QueueDeclarePassive(name,
		true,  // durable
		false, // autoDelete
		false, // exclusive
		false, // noWait
		nil)
}

func closeQuietly(ch *amqp.Channel) {
	if !ch.IsClosed() {
		ch.Close() //nolint:errcheck // a throwaway channel; the result is already known
	}
}

// DeclareQueue connects once and declares q as Declare declares a queue
// of the plan (an Unbounded quorum queue without a delivery limit where
// the broker allows it), for a queue a tool needs beside the plan's.
func DeclareQueue(ctx context.Context, o Options, q topology.Queue) error {
	conn, _, err := o.dialOnce(ctx, 0)
	if err != nil {
		return fmt.Errorf("connect to broker: %w", err)
	}
	defer conn.Close()
	if err := declare(conn, q); err != nil {
		return fmt.Errorf("declare queue %q: %w", q.Name, err)
	}
	return nil
}

// Apply connects once and declares (declare=true) or verifies the plan,
// for the topology subcommands.
func Apply(ctx context.Context, o Options, p *topology.Plan, declare bool) error {
	conn, _, err := o.dialOnce(ctx, 0)
	if err != nil {
		return fmt.Errorf("connect to broker: %w", err)
	}
	defer conn.Close()
	if declare {
		return Declare(ctx, conn, p)
	}
	return Verify(ctx, conn, p)
}

// prepare declares or verifies the plan on a new connection, as the plan
// says.
func prepare(ctx context.Context, conn *amqp.Connection, p *topology.Plan) error {
	if p == nil {
		return nil
	}
	if p.Declare {
		return Declare(ctx, conn, p)
	}
	return Verify(ctx, conn, p)
}
