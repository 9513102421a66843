"""A worker's channels to the other workers of its server (docs/workers.md, issue 35).

Each pair of workers shares one channel, a socket pair made by the supervisor
(gateway/supervisor.py); one a restarted worker gets arrives on the control socket, and so
does a new one after this worker or the other ended a channel for a protocol error (this
worker asks for it on the same socket). Over a channel both directions run: this worker's
sessions consume from and publish to the other's queues (:class:`~session.channel.remote.Remote`,
one per other worker, kept across restarts), and the other's sessions consume from this
worker's queues (:class:`~session.channel.owner.Owner`, one per live channel). Topology is
replicated: every change of queues, exchanges and bindings made here is sent to every worker,
which applies it, so that each routes locally and only a routed copy crosses; a channel that
opens starts with everything the worker knows.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import replace
from itertools import count
from typing import Final, Protocol, cast

from proton import Event, Handler
from proton.reactor import Container

from sluicegate.gateway.confirming import ChannelPublish, Pending, confirm
from sluicegate.gateway.durability import Durability
from sluicegate.gateway.proton.channel_socket import ChannelSocket
from sluicegate.gateway.proton.internals import Task, register
from sluicegate.gateway.queue_homes_file import HomesFile
from sluicegate.gateway.rules.tenancy import Tenancy
from sluicegate.gateway.rules.vhost_log import logged_name
from sluicegate.gateway.supervisor import CHANNEL, WorkerChannels
from sluicegate.queues.dead_lettering import DeadLetterRouter
from sluicegate.queues.errors import NotFound, PreconditionFailed, ResourceDeleted, ResourceLocked
from sluicegate.queues.exchanges import Exchange
from sluicegate.queues.filters.view import ViewCache
from sluicegate.queues.held_bytes import MESSAGE_OVERHEAD
from sluicegate.queues.message import Message
from sluicegate.queues.queue_homes import OwnerDeclared, proposed_home
from sluicegate.queues.queue_type import CreditReply as QueueReply
from sluicegate.queues.queue_type import Dispatch, Outcome, QueueType
from sluicegate.queues.registry import QueueRegistry
from sluicegate.queues.topology_log import loggable
from sluicegate.session.channel.codec import FRAME_OVERHEAD, ChannelError, FrameReader, encode
from sluicegate.session.channel.ends import Confirms
from sluicegate.session.channel.frames import (
    Answer,
    Attached,
    Confirm,
    CreditReply,
    Deliveries,
    Error,
    Frame,
    Letters,
    Publish,
    QueryOp,
    Settled,
    Short,
    Topology,
)
from sluicegate.session.channel.owner import Owner
from sluicegate.session.channel.queries import Asked, Figures, Reads
from sluicegate.session.channel.remote import (
    OUTCOMES,
    SETTLED,
    DebtOf,
    Remote,
    RemoteQueue,
    letters_fitting,
    owner_error,
)
from sluicegate.session.dead_letter_debt import DeadLetterDebt
from sluicegate.session.inbound import Unconfirmed
from sluicegate.session.inbound_flow import (
    HOLDER_SHARE,
    RECLASSIFY_FLOOR,
    InboundFlow,
    queue_weight,
)
from sluicegate.session.memory_budget import MemoryBudget
from sluicegate.session.outgoing_link import OutgoingLink
from sluicegate.session.remote_publishers import RemotePublishers
from sluicegate.wire.amqp_types import Value
from sluicegate.wire.decoding import decode
from sluicegate.wire.encoding import encode as encode_value
from sluicegate.wire.errors import AmqpError

log = logging.getLogger("sluicegate.peers")

# Seconds a management request waits for the owners' answers before it is refused: a worker
# answers a query at once, in its next reactor pass, so only one that is stuck takes this long.
QUERY_TIMEOUT: Final = 5.0
# A queue's registry and the queue, whose consumer on another worker left.
ConsumerLeft = Callable[[QueueRegistry, QueueType], None]
# The worker that serves the HTTP API (gateway/supervisor.py), the only one that creates and
# deletes virtual hosts at run time: its list of them is the one every worker keeps.
VHOSTS_WORKER: Final = 0
# Topology verbs of virtual hosts rather than of one virtual host's queues and exchanges.
_VHOST_VERBS: Final = frozenset({"vhost", "delete-vhost", "vhosts"})
# The condition a publish given back carries to its sender (an HTTP publish answers 503).
_GIVEN_BACK: Final = "amqp:resource-limit-exceeded"


class RuntimeVhostCopies(Protocol):
    """This worker's virtual hosts created at run time (gateway/runtime_vhosts.py), as another
    worker's changes make them."""

    def listing(self) -> dict[str, list[str]]:
        """Each one's name and the users granted everything in it."""
        ...

    def adopt(self, name: str, granted: list[str]) -> None:
        """Make ``name`` here too (or update its grants), without telling the other workers."""
        ...

    def drop(self, name: str) -> None:
        """Delete ``name`` here too, without telling the other workers."""
        ...


class VhostPlacement:
    """One virtual host's queues placed over the workers (queues/queue_homes.py's
    ``Placement``), its changes sent to every worker."""

    def __init__(self, peers: Peers, vhost: str, registry: QueueRegistry) -> None:
        self.peers = peers
        self.vhost = vhost
        self.registry = registry

    def remote(self, name: str) -> QueueType | None:
        peers = self.peers
        home = peers.homes.place(self.vhost, name)
        remote = peers.remotes.get(home)
        return None if remote is None else RemoteQueue(name, self.vhost, remote)

    def changed(self, change: list[object]) -> None:
        peers = self.peers
        if peers.applying:
            return
        if change[0] == "delete-queue":
            peers.homes.forget(self.vhost, str(change[1]))
        peers.broadcast(Topology(self.vhost, encode_value(cast(Value, change))))

    def used(self, name: str) -> None:
        if self.peers.applying:
            return
        queue = self.registry.get(name)
        if type(queue) is RemoteQueue:
            queue.used()

    def owner_declares(
        self, name: str, arguments: Mapping[str, object], *, durable: bool, auto_delete: bool
    ) -> OwnerDeclared | None:
        peers = self.peers
        figures = peers.reads.current
        if figures is None:
            return None
        key = (self.vhost, name, "declare")
        asked = figures.asked.get(key)
        if asked is not None:
            judged = _judged(
                asked, f"the worker that owns queue '{name}' refused its declaration: {asked.error}"
            )
            if judged is not OwnerDeclared.ASKED:
                # Its counts are the answer's: no other question for them.
                figures.asked[(self.vhost, name, "counts")] = asked
            return judged
        known = self.registry.get(name)
        if known is not None and type(known) is not RemoteQueue:
            return None
        # A stand-in's declaration is asked too: the one it was made with may be an attach's
        # that the owner's crossed, still on its way here (docs/workers.md).
        remote = peers.remotes.get(peers.homes.place(self.vhost, name))
        if remote is None:
            return None
        change = ["queue", name, loggable(arguments), durable, auto_delete]
        declaration = encode_value(cast(Value, change))
        figures.asked[key] = remote.ask(QueryOp.DECLARE, self.vhost, name, declaration)
        return OwnerDeclared.ASKED

    def owner_declares_exchange(
        self,
        name: str,
        type_name: str,
        arguments: Mapping[str, object],
        *,
        durable: bool,
        auto_delete: bool,
        internal: bool,
    ) -> OwnerDeclared | None:
        peers = self.peers
        figures = peers.reads.current
        if figures is None:
            return None
        key = (self.vhost, name, "declare-exchange")
        asked = figures.asked.get(key)
        if asked is not None:
            return _judged(
                asked, f"the worker that judges exchange '{name}' refused its declaration"
            )
        if _exchange_of(self.registry, name) is not None:
            return None
        # No worker owns an exchange: the one the placement hash names for its name judges it.
        remote = peers.remotes.get(proposed_home(self.vhost, name, peers.spec.workers))
        if remote is None:
            return None
        change = [
            "exchange",
            name,
            type_name,
            loggable(arguments),
            durable,
            auto_delete,
            internal,
        ]
        declaration = encode_value(cast(Value, change))
        figures.asked[key] = remote.ask(QueryOp.DECLARE_EXCHANGE, self.vhost, name, declaration)
        return OwnerDeclared.ASKED

    def owner_deletes(self, name: str) -> int | None:
        figures = self.peers.reads.current
        if figures is None:
            return None
        count = figures.deleted(self.vhost, name)
        if count is not None:
            return count
        queue = self.registry.get(name)
        if type(queue) is not RemoteQueue:
            return None
        key = (self.vhost, name, "delete")
        if key not in figures.asked:
            figures.asked[key] = queue.remote.ask(QueryOp.DELETE, self.vhost, name)
        return 0


# The share of the parked window that must be parked anew before the parked are walked again
# to keep the window (``Peers._give_back``): walked at every flush that parked anything, 4,800
# small publishes parked took 5 ms a flush, and a stream of them held the reactor for the
# whole second (adversary seed 65890). A sixteenth lets each peer's parked pass the window by
# at most that much until the next walk, and makes a walk's cost a constant per byte parked.
GIVE_BACK_STEP: Final = 16


class Peers:
    """This worker's channels, what crosses them, and the topology it shares."""

    def __init__(self, spec: WorkerChannels, registries: Mapping[str, QueueRegistry]) -> None:
        self.spec = spec
        self.homes = HomesFile(spec.root, spec.workers)
        # The management request being answered: what its stand-ins ask their owners.
        self.reads = Reads()
        # This worker's side of each channel, kept while the other worker restarts.
        self.remotes = {k: Remote(k, self.reads) for k in range(spec.workers) if k != spec.index}
        self.owners: dict[int, Owner] = {}
        self.sockets: dict[int, ChannelSocket] = {}
        # Each live channel's serial number (gateway/supervisor.py), which names it when this
        # worker asks the supervisor for a new one.
        self.serials: dict[int, int] = {}
        # Confirms of other workers' publishes, framed in runs at the flush.
        self._confirms: dict[int, Confirms] = {}
        # Other workers' publishes that reached this one while its memory budget was blocked,
        # in their order, and their bytes: stored and confirmed once it is not, as far as the
        # limit. The channel is read meanwhile, since it also carries the credit and
        # settlements of other workers' consumers of queues here, which drain them. Until
        # confirmed they are counted in their sender's budget, not here (``Remote.in_flight``):
        # each sender's budget holds its publishers, so what waits here is at most what the
        # other workers' budgets allow; counted here, it held no publisher and took this
        # worker's count to 3.6 times its limit (adversary seed 65401, docs/workers.md).
        self._parked: deque[tuple[int, Publish]] = deque()
        # The queues they go to: a later publish to one of these is parked too, so that a
        # queue's messages are stored in their order.
        self._parked_queues: set[tuple[str, str]] = set()
        # The budget as the last flush found it: blocked, and the bytes a queue must weigh
        # for its publishes to be parked (0: every publish, at the ceiling). While it is
        # blocked every publish is parked as it comes and weighed at the flush, where the holds
        # are known (:meth:`_store_light`); while it is not, they are stored as they come up to
        # the limit less what was stored since the flush, and parked past it: stored as they
        # came whatever the count, one pass's reads of the channel went past the limit and
        # through the part unweighed (adversary seed 65800).
        self._blocked = False
        self._heavy = 0
        # A holder's floor, whether at the ceiling or not: what a light queue weighs less than.
        self._floor = 0
        # The least a publisher that has not grown may grow by while blocked, the holds' own
        # least (session/remote_publishers.py's admit).
        self._least = 0
        self._below_limit = 0
        # Other workers' publishes given back released past the parked window (a metric), and
        # the bytes parked since the window was last kept: what was kept fits it until more
        # is parked, and a flush walks the parked only once that is a step of the window
        # (:data:`GIVE_BACK_STEP`).
        self.given_back = 0
        self._parked_since = 0
        # Publishes parked in all (a count), and what the last walk of the light ones found
        # when it stored nothing: the room, that count, the holds' decisions and the weight a
        # queue parks at. Until one of them changes, or the room grows by a step, a walk would
        # store nothing again (:meth:`_store_light`).
        self._parked_count = 0
        self._light_idle: tuple[int, int, int, int] | None = None
        # Set while a change from another worker is applied: it is not sent on again.
        self.applying = False
        # Channels ended because their peer broke the protocol (a metric: it never should).
        self.protocol_errors = 0
        # Management requests waiting for owners' answers, one per request.
        self.gathering: dict[_Gathering, None] = {}
        # Other workers' links as the memory budget holds them: the inbound flow's, from
        # :meth:`serve` on (none is recorded before).
        self._publishers = RemotePublishers()
        # This worker's inbound flow, from :meth:`serve` on.
        self._flow: InboundFlow | None = None
        for name, registry in registries.items():
            self.place(name, registry)

    def serve(
        self,
        tenancy: Tenancy,
        container: Container,
        durability: Durability | None,
        route: Callable[[list[Dispatch]], None],
        delivered: Callable[[OutgoingLink, list[Message]], None],
        replied: Callable[[OutgoingLink, QueueReply], None],
        refuse: Callable[[OutgoingLink, AmqpError], None],
        attached: Callable[[OutgoingLink], None],
        queue_deleted: Callable[[QueueRegistry, str], None],
        consumer_left: ConsumerLeft,
        max_message_size: int,
        max_queue_credit: int,
        filter_views: ViewCache,
        vhosts: RuntimeVhostCopies,
        debt_of: DebtOf,
        hold: Callable[[DeadLetterDebt], None],
        flow: InboundFlow,
        shorted: Callable[[OutgoingLink, int], None],
    ) -> None:
        """Start serving the channels the worker was forked with, and take new ones;
        ``filter_views`` is what the worker's consumer filters decode messages through,
        ``vhosts`` its virtual hosts created at run time; ``debt_of`` finds a consumer's
        connection's dead-letter debt, which the letters its outcomes make on another worker
        are charged to, and ``hold`` applies a debt's changed hold (gateway/sending.py);
        ``flow`` is this worker's inbound flow: its ``remote`` are the other workers' links as
        the memory budget holds them, which what their publishes store here is charged to
        (session/remote_publishers.py), and its links wait for the workers that give their
        publishes back (:meth:`_give_back`); ``shorted`` tells a consumer's session that its
        queue's owner holds back deliveries past the bytes it reserved (frames.Short)."""
        self.tenancy = tenancy
        self.container = container
        self.durability = durability
        self._route = route
        self._delivered = delivered
        self._replied = replied
        self._shorted = shorted
        self._refuse = refuse
        self._attached = attached
        self._queue_deleted = queue_deleted
        self._consumer_left = consumer_left
        self.max_frame_size = max_message_size + FRAME_OVERHEAD
        self.max_queue_credit = max_queue_credit
        self.filter_views = filter_views
        self.vhosts = vhosts
        self._hold = hold
        self._publishers = flow.remote
        self._flow = flow
        for remote in self.remotes.values():
            remote.max_filter_set_size = max_message_size
            remote.max_publish_size = max_message_size
            remote.debt_of = debt_of
        for peer, sock in sorted(self.spec.channels.items()):
            self.open(peer, sock, self.spec.serials.get(peer, 0))
        self.spec.channels = {}
        if self.spec.control is not None:
            self.spec.control.setblocking(False)
            self._control = register(container, self.spec.control, _Control(self))

    # -- channels -------------------------------------------------------------------------

    def open(self, peer: int, sock: socket.socket, serial: int) -> None:
        """A channel to worker ``peer`` (again): everything known here goes first."""
        old = self.sockets.get(peer)
        if old is not None:
            old.end("the supervisor made a new channel")
        self.serials[peer] = serial
        self.sockets[peer] = ChannelSocket(
            self.container,
            sock,
            FrameReader(self.max_frame_size),
            lambda frames: self.received(peer, frames),
            lambda reason: self.ended(peer, reason),
        )
        self.owners[peer] = Owner(
            self._find,
            self.max_queue_credit,
            self._used,
            delete=self._delete,
            declare=lambda vhost, name, declaration: self._declare(peer, vhost, name, declaration),
            views=self.filter_views,
            clock=self.tenancy.default.registry.clock,
            routers=self._router,
            held=self.tenancy.default.registry.held,
        )
        self.owners[peer].max_deliveries_size = self.max_frame_size - FRAME_OVERHEAD
        self._confirms[peer] = Confirms()
        self.remotes[peer].opened()
        channel = self.sockets[peer]
        for frame in self._snapshot():
            channel.send(encode(frame))

    def ended(self, peer: int, reason: str) -> None:
        """The channel to ``peer`` ended: what crossed it ends as a lost connection's would."""
        channel = self.sockets.pop(peer, None)
        if channel is not None and channel.broken:
            self.protocol_errors += 1
            log.error("channel to worker %d ended: %s", peer, reason)
            self._ask_again(peer)
        else:
            log.warning("channel to worker %d ended: %s", peer, reason)
        self._confirms.pop(peer, None)
        self._publishers.forget(peer)
        self._light_idle = None
        if self._flow is not None:
            self._flow.owner_stored(peer)
        # Its parked publishes go unconfirmed: the peer releases their publishers as its side
        # of the channel ends.
        kept = [(other, publish) for other, publish in self._parked if other != peer]
        self._parked = deque(kept)
        self._parked_queues = {(publish.vhost, publish.queue) for _, publish in kept}
        owner = self.owners.pop(peer, None)
        if owner is not None:
            self._route(owner.close())
            self._left(owner)
        remote = self.remotes[peer]
        keys, tokens = remote.lost()
        for debt in remote.forgive():
            self._hold(debt)
        self._gathered()
        gone = ResourceDeleted(f"worker {peer}, where the queue lives, ended; attach again")
        for key in keys:
            self._refuse(cast(OutgoingLink, key), gone)
        for token in tokens:
            if token is not None:
                confirm(cast(Pending, token), Outcome.RELEASED, None)

    def _ask_again(self, peer: int) -> None:
        """Ask the supervisor for a new channel to ``peer``, this one having been ended for a
        protocol error: the two workers' queues are out of each other's reach until it comes
        (after the supervisor's pause, session/channel/remakes.py)."""
        control = self.spec.control
        if control is None:
            return
        try:
            control.send(CHANNEL.pack(peer, self.serials.get(peer, 0)))
        except OSError as error:
            # Full (the supervisor is stuck) or gone (it died: this worker is told to stop).
            log.error("could not ask the supervisor for a channel to worker %d: %s", peer, error)

    def close(self) -> None:
        """The worker stops: every channel and the control socket leave the reactor."""
        for channel in list(self.sockets.values()):
            channel.close()
        self.sockets.clear()
        control = getattr(self, "_control", None)
        if control is not None and not control.is_terminal:
            control.terminate()
            control.update()

    def consumers_of(self, queue: QueueType) -> int:
        """How many consumers on other workers ``queue`` (one of this worker's) has."""
        return sum(owner.consumers_of(queue) for owner in self.owners.values())

    def gather(self, figures: Figures, done: Callable[[Asked | None], None]) -> None:
        """Call ``done`` once every question ``figures`` asked is answered (with None) or
        cannot be (with why: its owner is not serving or has no such queue, or did not answer
        within :data:`QUERY_TIMEOUT`)."""
        if not figures.pending:
            done(figures.failure)
            return
        waiting = _Gathering(self, figures, done)
        self.gathering[waiting] = None
        waiting.timer = self.container.schedule(QUERY_TIMEOUT, waiting)

    def _gathered(self) -> None:
        """Answer the requests whose questions are all done."""
        for waiting in [w for w in self.gathering if not w.figures.pending]:
            waiting.finish(waiting.figures.failure)

    def held(self) -> int:
        """Bytes this worker answers for beyond its queues: what it sent other workers and
        they have not confirmed yet, and their pre-settled consumers' recent deliveries
        (docs/bounds.md). The publishes parked here are their senders' to count."""
        sent = sum(remote.in_flight for remote in self.remotes.values())
        return sent + sum(owner.recent_bytes for owner in self.owners.values())

    def budget_figures(self) -> dict[str, int]:
        """What weighs on this worker's publishers' part from the channels, for its metrics
        (gateway/statistics.py)."""
        charged = self._publishers.publishers.values()
        return {
            "channel_sent_bytes": sum(remote.in_flight for remote in self.remotes.values()),
            "channel_parked_bytes": sum(_publish_bytes(publish) for _, publish in self._parked),
            "channel_given_back": self.given_back,
            "remote_publishers": len(charged),
            "remote_publishers_held": sum(1 for publisher in charged if publisher.held),
        }

    def _queue_gone(self, queue: QueueType) -> None:
        """A queue here was deleted: other workers' links forget it (remote_publishers.py), and
        what is parked for it is released at the next walk."""
        self._publishers.queue_deleted(queue)
        self._light_idle = None

    def letters_sent(self) -> tuple[int, int, int]:
        """Bytes of this worker's dead letters sent to other workers and not yet confirmed
        (what the memory budget's letters' part holds, session/memory_budget.py), the most one
        channel's window has held, and the bytes of its publishes sent and not confirmed
        within each owner's parked window (:meth:`_give_back`: the letters' window, the same
        on both sides), which that part holds too."""
        remotes = self.remotes.values()
        return (
            sum(remote.letters_in_flight for remote in remotes),
            max((remote.letters_peak for remote in remotes), default=0),
            sum(
                min(remote.in_flight - remote.letters_in_flight, remote.letter_window)
                for remote in remotes
            ),
        )

    def place(self, vhost: str, registry: QueueRegistry) -> None:
        """A virtual host's queues are placed over the workers (one made at run time too), and
        its dead letters to other workers' queues kept within their channels' windows."""
        registry.placement = VhostPlacement(self, vhost, registry)
        registry.dead_letter_router.fits = letters_fitting
        registry.gone = self._queue_gone

    def vhost_created(self, vhost: str, granted: list[str]) -> None:
        """Every worker makes ``vhost`` too, its creator's grant with it."""
        self._vhost_change(Topology(vhost, encode_value(["vhost", cast(Value, granted)])))

    def vhost_deleted(self, vhost: str) -> None:
        """Every worker deletes ``vhost`` too (its queues' deletions went before)."""
        self._vhost_change(Topology(vhost, encode_value(["delete-vhost"])))

    def _vhost_change(self, frame: Topology) -> None:
        """Sent at once rather than at the flush: the HTTP API answers the change next, and a
        client told it exists may connect to any worker. A channel is read in order, and a
        new connection needs round trips with that worker before its OPEN names the vhost."""
        self.broadcast(frame)
        for channel in list(self.sockets.values()):
            if not channel.closed and channel.output:
                channel.flush()

    def broadcast(self, frame: Frame) -> None:
        pieces = encode(frame)
        for channel in self.sockets.values():
            channel.send(pieces)

    # -- frames ---------------------------------------------------------------------------

    def received(self, peer: int, frames: list[Frame]) -> None:
        """Frames from worker ``peer``, in order; a broken one ends the channel."""
        channel = self.sockets.get(peer)
        if channel is None:
            return
        answered = False
        try:
            for frame in frames:
                answered |= type(frame) is Answer
                self._receive(peer, channel, frame)
        except ChannelError as error:
            channel.end(f"worker {peer} broke the channel protocol: {error}", broken=True)
        if answered:
            self._gathered()

    def _receive(self, peer: int, channel: ChannelSocket, frame: Frame) -> None:
        kind = type(frame)
        remote = self.remotes[peer]
        if kind is Deliveries:
            delivered = remote.delivered(cast(Deliveries, frame))
            if delivered is not None:
                self._delivered(cast(OutgoingLink, delivered[0]), delivered[1])
        elif kind is CreditReply:
            replied = remote.replied(cast(CreditReply, frame))
            if replied is not None:
                self._replied(cast(OutgoingLink, replied[0]), replied[1])
        elif kind is Short:
            shorted = remote.shorted(cast(Short, frame))
            if shorted is not None:
                self._shorted(cast(OutgoingLink, shorted[0]), shorted[1])
        elif kind is Confirm:
            confirmed = cast(Confirm, frame)
            error = (
                owner_error(confirmed.condition, confirmed.description)
                if confirmed.condition
                else None
            )
            tokens = remote.confirmed(confirmed)
            given_back = confirmed.condition == _GIVEN_BACK
            flow = self._flow
            assert flow is not None  # a channel is read from serve on
            for token in tokens:
                if token is not None:
                    if given_back and type(token) is Unconfirmed:
                        # Before its settlement asks for a renewal: the link waits.
                        token.inbound.given_back(peer, token.link)
                    confirm(cast(Pending, token), OUTCOMES[confirmed.outcome], error)
            if tokens and not given_back and flow.owner_full:
                flow.owner_stored(peer)
        elif kind is Attached:
            taken = remote.attached(cast(Attached, frame))
            if taken is not None:
                self._attached(cast(OutgoingLink, taken))
        elif kind is Error:
            refusal = cast(Error, frame)
            key = remote.refused(refusal)
            if key is not None:
                error = owner_error(refusal.condition, refusal.description)
                self._refuse(cast(OutgoingLink, key), error)
        elif kind is Publish:
            publish = cast(Publish, frame)
            to = (publish.vhost, publish.queue)
            if self._blocked or self._below_limit <= 0 or to in self._parked_queues:
                self._park(peer, publish)
            else:
                head, tail, took = _split(publish, self._below_limit, first=True)
                assert head is not None  # the first message always goes
                self._below_limit -= took
                self._store(peer, head)
                if tail is not None:
                    self._park(peer, tail)
        elif kind is Topology:
            self.apply(peer, cast(Topology, frame))
        elif kind is Answer:
            remote.answered(cast(Answer, frame))
        elif kind is Letters:
            debt = remote.letters(cast(Letters, frame))
            if debt is not None:
                self._hold(debt)
        else:
            owner = self.owners[peer]
            frames, local = owner.receive(frame)
            for out in frames:
                channel.send(encode(out))
            if local:
                self._route(local)
            if owner.left:
                self._left(owner)

    def _park(self, peer: int, publish: Publish) -> None:
        """Keep another worker's run to store later, after what is parked before it."""
        self._parked.append((peer, publish))
        self._parked_queues.add((publish.vhost, publish.queue))
        self._parked_since += _publish_bytes(publish)
        self._parked_count += 1

    def _left(self, owner: Owner) -> None:
        """Remote consumers of queues here left: an auto-delete queue may go, and an
        x-expires countdown restarts, as when a consumer here leaves."""
        left, owner.left = owner.left, []
        for vhost, queue in left:
            found = self.tenancy.vhosts.get(vhost)
            if found is not None and found.registry.get(queue.name) is queue:
                self._consumer_left(found.registry, queue)

    def _declare(self, peer: int, vhost: str, name: str, declaration: bytes) -> bool:
        """Management on worker ``peer`` declares a queue here: whether it was made now. One
        this worker had is not refused when the arguments differ: its declaration goes to the
        asker again, before this answer, and the asker refuses the client with it, as this
        worker would (docs/workers.md). Sent again because a third worker's declaration, which
        made it here, may still be on its way to the asker."""
        found = self.tenancy.vhosts.get(vhost)
        if found is None:
            raise NotFound(f"no vhost '{vhost}'")
        # Checked to decode as the frame was read (session/channel/codec.py).
        change, _ = decode(declaration, 0)
        if isinstance(change, list) and change[:2] == ["exchange", name] and len(change) == 7:
            return self._declare_exchange(peer, vhost, found.registry, change)
        if not isinstance(change, list) or change[:2] != ["queue", name] or len(change) != 5:
            raise ChannelError(f"a declaration of queue '{name}' that is not one")
        registry = found.registry
        had = registry.get(name) is not None
        if had and registry.settings(name).exclusive:
            # A connection's queue here, never placed nor replicated: not the asker's to see.
            raise ResourceLocked(f"queue '{name}' is exclusive to a connection on its worker")
        try:
            _apply(registry, change)
        except PreconditionFailed:
            if not had:
                raise
        if had:
            settings = registry.settings(name)
            arguments = cast(dict[Value, Value], dict(settings.raw_arguments))
            kept = ["queue", name, arguments, settings.durable, settings.auto_delete]
            self.sockets[peer].send(encode(Topology(vhost, encode_value(cast(Value, kept)))))
        return not had

    def _declare_exchange(
        self, peer: int, vhost: str, registry: QueueRegistry, change: list[Value]
    ) -> bool:
        """Management on worker ``peer`` declares an exchange this worker judges: whether it
        was made now (and broadcast, before the answer). One this worker had goes to the asker
        again, before the answer, and the asker judges the declaration by it, as this worker
        would: a different type or flags refused with precondition-failed (docs/workers.md)."""
        had = _exchange_of(registry, str(change[1]))
        try:
            _apply(registry, change)
        except PreconditionFailed:
            if had is None:
                raise
        if had is not None:
            kept = _exchange_change(had)
            self.sockets[peer].send(encode(Topology(vhost, encode_value(cast(Value, kept)))))
        return had is None

    def _delete(self, vhost: str, name: str) -> int:
        """Management on another worker deletes a queue here, as management here would: the
        ready messages deleted (0 for a stream, as RabbitMQ's coordinator answers). The
        deletion is broadcast before the answer is sent, so it reaches the asker first."""
        registry = self.tenancy.vhosts[vhost].registry
        stream = registry.settings(name).arguments.queue_type == "stream"
        count = registry.delete_queue(name)
        self._queue_deleted(registry, name)
        return 0 if stream else count

    def _router(self, vhost: str) -> DeadLetterRouter | None:
        """Where the letters of a remote consumer's settlement in ``vhost`` go."""
        found = self.tenancy.vhosts.get(vhost)
        return None if found is None else found.registry.dead_letter_router

    def _used(self, vhost: str, name: str) -> None:
        """A client of another worker used a queue here: its x-expires countdown restarts."""
        found = self.tenancy.vhosts.get(vhost)
        if found is not None:
            found.registry.renew_lease(name)

    def flush(self, budget: MemoryBudget) -> None:
        """Send what gathered since the last flush. While the memory budget is blocked, other
        workers' publishes to the queues that hold it are parked, as this worker's publishers
        to them are held, and every one at the ceiling; once it is not blocked, the parked
        ones are stored first, in their order."""
        blocked = self._blocked = budget.blocked
        # What this worker's letters may make a peer park while it is blocked: the part of
        # its margin it keeps for them, split among its peers (session/memory_budget.py).
        window = budget.keep_for_letters(len(self.remotes))
        for remote in self.remotes.values():
            remote.letter_window = window
        full = budget.blocked and budget.publishers_full(budget.current)
        self._floor = int(budget.margin * HOLDER_SHARE)
        self._heavy = 0 if full else self._floor
        self._least = budget.margin // RECLASSIFY_FLOOR
        parked = self._parked
        # Stored as far as the limit: what they add blocks the budget again at its update.
        room = budget.limit - budget.current
        first = True
        while parked and not blocked and room > 0:
            peer, publish = parked.popleft()
            head, tail, took = _split(publish, room, first)
            if tail is not None:
                parked.appendleft((peer, tail))
            if head is None:
                break
            first = False
            room -= took
            if peer in self._confirms:
                self._store(peer, head)
        self._below_limit = room
        if parked and blocked and not full:
            room = budget.publishing_ceiling - budget.publishing_level(budget.current)
            idle = self._light_idle
            if (
                idle is None
                or room >= idle[0] + budget.margin // RECLASSIFY_FLOOR
                or idle[1:] != self._light_state()
            ):
                self._store_light(room)
        if blocked and self._parked_since >= max(1, window // GIVE_BACK_STEP):
            self._parked_since = 0
            self._give_back(window)
        parked = self._parked
        if not parked:
            self._parked_queues.clear()
        # A channel that ends while written leaves the dict.
        for peer, channel in list(self.sockets.items()):
            if channel.closed:
                continue
            for frame in self.owners[peer].flush():
                channel.send(encode(frame))
            remote = self.remotes[peer]
            if remote.outgoing:
                for frame in remote.outgoing:
                    channel.send(encode(frame))
                remote.outgoing.clear()
            for frame in self._confirms[peer].take():
                channel.send(encode(frame))
            if channel.output:
                channel.flush()

    # -- publishes from other workers -----------------------------------------------------

    def _store_light(self, room: int) -> None:
        """Store, while blocked, the parked publishes to queues that weigh less than a holder's
        floor, in their order, within ``room`` (the publishers' part left): as this worker's
        own light publishers go on. Parked once at the publishers' ceiling, a light queue's
        publishes otherwise waited until the budget let go, for good when queues nobody reads
        hold it (adversary seed 66100: the prober's queue, its worker just past its limit).
        Each run is admitted by what its publisher grew by with it against its share of the
        room left (session/remote_publishers.py), so that no run takes the last of it. A queue
        with a letter, a heavy publish or a held publisher's parked keeps the rest of its own
        waiting."""
        kept: deque[tuple[int, Publish]] = deque()
        waiting: set[tuple[str, str]] = set()
        before = len(self._parked)
        idle = (room, *self._light_state())
        grown: dict[tuple[int, int], int] = {}
        for peer, publish in self._parked:
            to = (publish.vhost, publish.queue)
            if to not in waiting and peer in self._confirms:
                queue = self._find(publish.vhost, publish.queue)
                if queue is None:
                    # Deleted meanwhile: released, as _store says.
                    self._store(peer, publish)
                    continue
                nbytes = _publish_bytes(publish)
                if not self._parks(peer, publish, queue) and self._publishers.admit(
                    peer, publish.publisher, queue, nbytes, room, self._least, queue_weight, grown
                ):
                    room -= nbytes
                    self._store(peer, publish)
                    continue
            elif peer not in self._confirms:
                continue  # its channel ended: it goes unconfirmed
            waiting.add(to)
            kept.append((peer, publish))
        self._parked = kept
        self._parked_queues = waiting
        self._light_idle = idle if len(kept) == before else None

    def _light_state(self) -> tuple[int, int, int]:
        """What, beside the room, decides whether a parked publish to a light queue is stored
        (:meth:`_store_light`): the publishes parked, the holds' decisions, and the weight a
        queue's publishes park at."""
        flow = self._flow
        assert flow is not None  # a channel is read from serve on
        return self._parked_count, flow.decisions, self._heavy

    def _give_back(self, window: int) -> None:
        """Keep parked, of each other worker's letters and publishes, at most ``window`` bytes
        (the letters' window, a quarter of the margin split among the peers,
        session/memory_budget.py), and give the publishes past it back ``released`` with
        ``amqp:resource-limit-exceeded``, which the client may send again.

        The sender counts what is parked until it is confirmed, and an owner blocked for good
        by queues nobody reads confirms nothing, so what it keeps is counted by the sender for
        as long: kept whole, seed 71002's 32.5 MB of one worker's publishes held it 5.5 MB
        past its ceiling, its prober waiting. Within the window the sender weighs them in the
        letters' part, not the publishers' (``MemoryBudget.parked_sent``).

        Letters are never given back: their sender keeps them within the window
        (``Remote.letter_fits``), so they only leave the publishes less of it. Publishes to
        light queues (under a holder's floor, their publisher not held) have a window of their
        own, oldest first: one is stored as soon as the budget is under its publishers' ceiling
        again (:meth:`_store_light`), where one to a queue nobody reads waits for good. Given
        back the newest first whatever their queue, a moment at the ceiling (a fan-out's copies
        to another worker counted whole until confirmed) gave back the prober's publish behind
        1 MB of a fan-out's parked copies (adversary seed 65832); behind the other worker's
        letters filling the window, every one (65842). What is left of the window after the
        letters and the light ones goes to the others, oldest first. So a sender counts at
        most two windows parked here.

        Within each of the two kinds, a run that does not fit keeps the messages that do, and
        every later run of that worker goes back whole, so that what stays parked of a queue
        keeps its order (a queue's publishes are all of one kind). A worker's first run kept
        of each kind keeps at least a message whatever its size: once stored, its confirm
        tells the sender this worker takes its publishes again (``InboundFlow.owner_stored``)."""
        parked = self._parked
        # What is kept of each peer: its letters and everything kept (``kept_bytes``), and of
        # that its publishes to light queues (``light_bytes``), which have a window of their own.
        kept_bytes: dict[int, int] = {}
        light_bytes: dict[int, int] = {}
        for peer, publish in parked:
            if publish.letters:
                kept_bytes[peer] = kept_bytes.get(peer, 0) + _publish_bytes(publish)
        # A queue's weight is read once a walk: thousands of small publishes parked for a few
        # queues each read their queue's statistics, 15 ms a flush at 4,800 (seed 65890).
        weights: dict[tuple[str, str], int | None] = {}
        light = [self._light(peer, publish, weights) for peer, publish in parked]
        fits = [0] * len(parked)
        for light_pass in (True, False):
            counted = light_bytes if light_pass else kept_bytes
            full: set[int] = set()
            for index, (peer, publish) in enumerate(parked):
                if publish.letters or light[index] is not light_pass or peer in full:
                    continue
                if peer not in self._confirms:
                    fits[index] = len(publish.payloads)  # its channel ended: unconfirmed
                    continue
                before = counted.get(peer)
                fit, took = _fitting(publish.payloads, window - (before or 0), before is None)
                fits[index] = fit
                if fit:
                    counted[peer] = (before or 0) + took
                    if light_pass:
                        kept_bytes[peer] = kept_bytes.get(peer, 0) + took
                if fit < len(publish.payloads):
                    full.add(peer)
        if all(
            publish.letters or fit == len(publish.payloads)
            for (_, publish), fit in zip(parked, fits, strict=True)
        ):
            return
        kept: deque[tuple[int, Publish]] = deque()
        for (peer, publish), fit in zip(parked, fits, strict=True):
            payloads = publish.payloads
            if publish.letters or fit == len(payloads):
                kept.append((peer, publish))
                continue
            if fit:
                kept.append(
                    (peer, replace(publish, payloads=payloads[:fit], stamps=publish.stamps[:fit]))
                )
            first = publish.publish
            self._confirms[peer].refused(
                first + fit,
                first + len(payloads) - 1,
                Settled.RELEASED,
                _GIVEN_BACK,
                f"worker {self.spec.index}'s memory budget is blocked; publish again later",
            )
            self.given_back += len(payloads) - fit
        self._parked = kept
        self._parked_queues = {(publish.vhost, publish.queue) for _, publish in kept}

    def _light(
        self, peer: int, publish: Publish, weights: dict[tuple[str, str], int | None]
    ) -> bool:
        """Whether a parked publish goes to a light queue (under a holder's floor, or deleted
        meanwhile) from a publisher not held: stored as soon as the budget is under its
        publishers' ceiling (:meth:`_parks`). ``weights``: the queues' weights read so far
        (None: deleted), by virtual host and name."""
        to = (publish.vhost, publish.queue)
        if to in weights:
            weight = weights[to]
        else:
            queue = self._find(publish.vhost, publish.queue)
            weight = weights[to] = None if queue is None else queue_weight(queue)
        return weight is None or (
            weight < self._floor and not self._publishers.held(peer, publish.publisher)
        )

    def _parks(self, peer: int, publish: Publish, queue: QueueType) -> bool:
        """Whether a parked publish to ``queue`` waits on while blocked: at the ceiling, when
        its queue holds at least a holder's floor (session/inbound_flow.py: a quarter of the
        margin), or when the budget holds its publisher for what it stored here
        (session/remote_publishers.py), as this worker's publishers are weighed. Dead letters
        always wait: no hold weighs them, and stored into light queues they took a worker
        through its margin to the ceiling, where every publisher waits (seed 65400); this
        worker's own letters are routed only below its limit (gateway/dead_letters.py)."""
        return (
            publish.letters
            or self._heavy == 0
            or self._publishers.held(peer, publish.publisher)
            or queue_weight(queue) >= self._heavy
        )

    def _store(self, peer: int, frame: Publish) -> None:
        """Store another worker's run of publishes in a queue here; each is confirmed once
        stored. Their envelopes were read where they were published (``frame.stamps``).

        What it stores is charged to the budget at once, as a read of this worker's own
        publishers is (``MemoryBudget.reading``), until the next flush counts what the queues
        hold: stored after the flush that decided who waits, uncharged, the light runs left
        this worker's publishers the room they had just taken, and one pass's reads took it
        again, past the publishers' ceiling, where every publisher waits for as long as queues
        nobody reads hold it (the likeliest path to adversary seed 65854's worker, 187 KB past
        that ceiling with its prober waiting, which its replay did not show again)."""
        flow = self._flow
        assert flow is not None  # a channel is read from serve on
        flow.budget.reading += _publish_bytes(frame)
        confirms = self._confirms[peer]
        first = frame.publish
        vhost = self.tenancy.vhosts.get(frame.vhost)
        queue = None if vhost is None else self._find(frame.vhost, frame.queue)
        if vhost is None or queue is None:
            # As a message routed to a queue deleted meanwhile: released.
            for publish in range(first, first + len(frame.payloads)):
                confirms.add(publish, Settled.RELEASED)
            return
        registry = vhost.registry
        durability = self.durability
        exchange, routing_key = frame.exchange, frame.routing_key
        dispatches: list[Dispatch] = []
        enqueue = queue.enqueue
        stamped = zip(count(first), frame.payloads, frame.stamps)
        if durability is None or not registry.logged(queue.name):
            # Nothing of this run goes through the log: its confirms are one run of ids, not
            # one call per message, broken only where the queue refuses one.
            accepted = first
            for publish, payload, (expires, header, delivery_count) in stamped:
                message = Message(
                    payload,
                    delivery_count,
                    expires=expires,
                    exchange=exchange,
                    routing_key=routing_key,
                    header=header,
                )
                try:
                    dispatches.extend(enqueue(message))
                except AmqpError as error:
                    confirms.accepted(accepted, publish - 1)
                    confirms.add(publish, Settled.REJECTED, error.condition, str(error))
                    accepted = publish + 1
            confirms.accepted(accepted, first + len(frame.payloads) - 1)
            if dispatches:
                self._route(dispatches)
            return
        for publish, payload, (expires, header, delivery_count) in stamped:
            message = Message(
                payload,
                delivery_count,
                expires=expires,
                exchange=exchange,
                routing_key=routing_key,
                header=header,
            )
            if queue.persists(message):
                pending = ChannelPublish(peer, publish, self)
                stored = durability.persist(
                    logged_name(frame.vhost, queue.name), queue.as_stored(message), pending
                )
                try:
                    dispatches.extend(enqueue(stored))
                except AmqpError as error:
                    durability.withdraw(stored)
                    confirms.add(publish, Settled.REJECTED, error.condition, str(error))
                continue
            try:
                dispatches.extend(enqueue(message))
            except AmqpError as error:
                confirms.add(publish, Settled.REJECTED, error.condition, str(error))
                continue
            confirms.add(publish, Settled.ACCEPTED)
        if dispatches:
            self._route(dispatches)

    def confirmed(self, pending: ChannelPublish, outcome: Outcome, error: AmqpError | None) -> None:
        """Another worker's publish is stored (or refused): its confirm goes at the flush."""
        confirms = self._confirms.get(pending.peer)
        if confirms is not None:
            confirms.add(
                pending.publish,
                SETTLED[outcome],
                "" if error is None else error.condition,
                "" if error is None else str(error),
            )

    # -- topology -------------------------------------------------------------------------

    def _find(self, vhost: str, name: str) -> QueueType | None:
        """A queue this worker owns."""
        found = self.tenancy.vhosts.get(vhost)
        queue = None if found is None else found.registry.get(name)
        return None if queue is None or type(queue) is RemoteQueue else queue

    def apply(self, peer: int, frame: Topology) -> None:
        """Worker ``peer``'s change of the topology, applied here without being sent on."""
        change, _ = decode(frame.change, 0)
        if isinstance(change, list) and change and change[0] in _VHOST_VERBS:
            self._apply_vhosts(frame.vhost, change)
            return
        vhost = self.tenancy.vhosts.get(frame.vhost)
        if vhost is None:
            return
        registry = vhost.registry
        self.applying = True
        try:
            try:
                _apply(registry, cast(list[Value], change))
            except PreconditionFailed:
                if not self._owners_declaration(peer, frame.vhost, registry, change):
                    raise
            if cast(list[Value], change)[0] == "delete-queue":
                self._queue_deleted(registry, str(cast(list[Value], change)[1]))
        except (AmqpError, ValueError, TypeError, IndexError) as error:
            log.warning("a topology change from another worker was not applied: %s", error)
        finally:
            self.applying = False

    def _owners_declaration(
        self, peer: int, vhost: str, registry: QueueRegistry, change: Value
    ) -> bool:
        """Whether a declaration that differs from the stand-in's here is its owner's, then
        taken in place of the stand-in's. A link attaching here declared the queue with the
        defaults while the owner declared it otherwise (management there, or another worker's
        declaration it judged first): the two crossed on the channel, the owner refused this
        worker's, and its own stands on every worker (docs/workers.md)."""
        if not isinstance(change, list) or change[0] != "queue" or len(change) != 5:
            return False
        _, name, arguments, durable, auto_delete = change
        name = str(name)
        if (
            type(registry.get(name)) is not RemoteQueue
            or self.homes.homes.home(vhost, name) != peer
        ):
            return False
        registry.take_declaration(
            name,
            cast(dict[str, object], arguments) or None,
            durable=bool(durable),
            auto_delete=bool(auto_delete),
        )
        log.info("queue '%s' of vhost '%s' takes its worker's declaration", name, vhost)
        return True

    def _apply_vhosts(self, name: str, change: list[Value]) -> None:
        """A virtual host made or deleted by the worker that serves the HTTP API, or its whole
        list when a channel to it opens: a worker that was down learns what changed."""
        self.applying = True
        try:
            verb = change[0]
            if verb == "vhost":
                self.vhosts.adopt(name, _users(change[1]))
            elif verb == "delete-vhost":
                self.vhosts.drop(name)
            else:
                listing = change[1]
                if not isinstance(listing, dict):
                    raise TypeError("a list of virtual hosts is a map")
                wanted = {str(key): _users(value) for key, value in listing.items()}
                for gone in set(self.vhosts.listing()) - set(wanted):
                    self.vhosts.drop(gone)
                for made, granted in wanted.items():
                    self.vhosts.adopt(made, granted)
        except (AmqpError, ValueError, TypeError, IndexError, OSError) as error:
            log.warning("a virtual host change from another worker was not applied: %s", error)
        finally:
            self.applying = False

    def _snapshot(self) -> list[Frame]:
        """Every queue, exchange and binding this worker knows, as changes to apply; from the
        worker that makes virtual hosts, their list first, so that theirs can be applied."""
        frames: list[Frame] = []
        if self.spec.index == VHOSTS_WORKER:
            listing = cast(dict[Value, Value], self.vhosts.listing())
            frames.append(Topology("", encode_value(["vhosts", listing])))
        for name, vhost in self.tenancy.vhosts.items():
            changes = _known(vhost.registry)
            frames.extend(Topology(name, encode_value(change)) for change in changes)
        return frames


class _Gathering(Handler):
    """A management request waiting for its owners' answers, and its deadline's timer.

    Finished, it lets go of its timer and of ``done``: the timer's task names it as its
    handler, and the cycle held ``done``'s request, its link pair and their proton objects past
    the client's connection, freed by a collection at any moment on any thread, beside the
    reactor in proton (adversary seed 65972: the worker aborted). A cancelled task stays in the
    container's heap until its deadline, naming this one, so ``done`` goes too.
    """

    def __init__(
        self, peers: Peers, figures: Figures, done: Callable[[Asked | None], None]
    ) -> None:
        super().__init__()
        self.peers = peers
        self.figures = figures
        self.done: Callable[[Asked | None], None] | None = done
        self.timer: Task | None = None

    def finish(self, failure: Asked | None) -> None:
        gathering = self.peers.gathering
        if self not in gathering:
            return
        del gathering[self]
        timer, self.timer = self.timer, None
        if timer is not None:
            timer.cancel()
        done, self.done = self.done, None
        if done is not None:
            done(failure)

    def on_timer_task(self, event: Event) -> None:
        self.timer = None
        if self.figures.pending:
            self.finish(Asked(f"the queue's worker did not answer within {QUERY_TIMEOUT} s"))
        else:
            self.finish(self.figures.failure)


class _Control:
    """The control socket: the supervisor hands over a channel, to a restarted worker or in
    place of one ended for a protocol error."""

    def __init__(self, peers: Peers) -> None:
        self.peers = peers

    def on_selectable_readable(self, event: object) -> None:
        control = self.peers.spec.control
        assert control is not None
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(control, CHANNEL.size, 1)
            except BlockingIOError:
                return
            if not data:
                log.warning("the supervisor's control socket closed")
                self.peers.close()
                return
            if not fds:
                continue
            peer, serial = CHANNEL.unpack(data)
            self.peers.open(peer, socket.socket(fileno=fds[0]), serial)


def _fitting(payloads: list[bytes], room: int, first: bool) -> tuple[int, int]:
    """How many of ``payloads``, from the first, fit ``room`` bytes (at least one if
    ``first``), and the bytes they take, each with its place in a queue."""
    fit = took = 0
    for payload in payloads:
        size = len(payload) + MESSAGE_OVERHEAD
        if took + size > room and not (first and not fit):
            break
        took += size
        fit += 1
    return fit, took


def _split(publish: Publish, room: int, first: bool) -> tuple[Publish | None, Publish | None, int]:
    """The messages of a run that fit ``room`` bytes (at least one if ``first``, so that a
    message larger than any room still goes), the rest, to park, and what the first take (as
    :func:`_publish_bytes` counts; a run that fits is weighed once, as before). A run holds what one
    publisher sent in a pass, up to the largest message: stored whole on the last byte of
    room, a run of a publisher's or HTTP client's messages, or of a fan-out's copies to one
    queue, took a worker its size past its limit, toward the publishers' ceiling, where every
    publisher waits for as long as queues nobody reads hold it (the likeliest path to
    adversary seeds 66072 and 66218, 33 KB and 125 KB past that ceiling, whose replays did
    not show it again)."""
    whole = _publish_bytes(publish)
    if whole <= room:
        return publish, None, whole
    payloads = publish.payloads
    fit, took = _fitting(payloads, room, first)
    if fit == len(payloads):
        return publish, None, took
    if fit == 0:
        return None, publish, 0
    stamps = publish.stamps
    head = replace(publish, payloads=payloads[:fit], stamps=stamps[:fit])
    tail = replace(
        publish, publish=publish.publish + fit, payloads=payloads[fit:], stamps=stamps[fit:]
    )
    return head, tail, took


def _publish_bytes(publish: Publish) -> int:
    """What a parked run of publishes holds: its messages and their overhead in a queue."""
    return sum(len(payload) for payload in publish.payloads) + MESSAGE_OVERHEAD * len(
        publish.payloads
    )


def _users(value: Value) -> list[str]:
    """The users a virtual host change grants everything in it."""
    if not isinstance(value, list) or not all(isinstance(user, str) for user in value):
        raise TypeError("a virtual host's grants are a list of user names")
    return [str(user) for user in value]


def _known(registry: QueueRegistry) -> list[list[Value]]:
    """A registry's topology as the changes that make it: queues, exchanges, then bindings."""
    changes: list[list[Value]] = []
    for info in registry.queues():
        settings = info.settings
        if settings.exclusive:
            continue
        arguments = cast(dict[Value, Value], dict(settings.raw_arguments))
        changes.append(["queue", info.name, arguments, settings.durable, settings.auto_delete])
    changes += _known_exchanges(registry)
    for binding in registry.bindings():
        arguments = cast(dict[Value, Value], dict(binding.arguments))
        changes.append(
            [
                "bind",
                binding.source,
                binding.destination,
                binding.binding_key,
                arguments,
                binding.to_exchange,
            ]
        )
    return changes


def _known_exchanges(registry: QueueRegistry) -> list[list[Value]]:
    """A registry's exchanges but the server's own, as the changes that declare them."""
    return [
        _exchange_change(exchange)
        for exchange in registry.exchanges()
        if exchange.name and not exchange.name.startswith("amq.")
    ]


def _exchange_change(exchange: Exchange) -> list[Value]:
    """The change that declares ``exchange`` as it is."""
    kept = exchange.settings
    arguments = cast(dict[Value, Value], dict(kept.arguments))
    return [
        "exchange",
        exchange.name,
        kept.type.value,
        arguments,
        kept.durable,
        kept.auto_delete,
        kept.internal,
    ]


def _exchange_of(registry: QueueRegistry, name: str) -> Exchange | None:
    """The exchange ``name`` if the registry has it."""
    try:
        return registry.exchange(name)
    except NotFound:
        return None


def _apply(registry: QueueRegistry, change: list[Value]) -> None:
    verb = change[0]
    if verb == "queue":
        _, name, arguments, durable, auto_delete = change
        registry.declare_queue(
            str(name),
            cast(dict[str, object], arguments) or None,
            durable=bool(durable),
            auto_delete=bool(auto_delete),
        )
    elif verb == "delete-queue":
        registry.delete_queue(str(change[1]))
    elif verb == "exchange":
        _, name, kind, arguments, durable, auto_delete, internal = change
        registry.declare_exchange(
            str(name),
            str(kind),
            durable=bool(durable),
            auto_delete=bool(auto_delete),
            internal=bool(internal),
            arguments=cast(dict[str, object], arguments) or None,
        )
    elif verb == "delete-exchange":
        with contextlib.suppress(NotFound):
            registry.delete_exchange(str(change[1]))
    elif verb in ("bind", "unbind"):
        _, source, destination, key, arguments, to_exchange = change
        act = registry.bind if verb == "bind" else registry.unbind
        act(
            str(source),
            str(destination),
            str(key),
            cast(dict[str, object], arguments),
            to_exchange=bool(to_exchange),
        )
    else:
        raise ValueError(f"unknown topology change {verb!r}")


def _judged(asked: Asked, refusal: str) -> OwnerDeclared:
    """Where a declaration asked of the worker that judges it stands: still asked, or made or
    had there; refused there, :class:`PreconditionFailed` with ``refusal``."""
    if not asked.done:
        return OwnerDeclared.ASKED
    if asked.answer is None:
        raise PreconditionFailed(refusal)
    return OwnerDeclared.MADE if asked.answer.purged else OwnerDeclared.HAD
