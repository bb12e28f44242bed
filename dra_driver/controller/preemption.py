"""Share-aware preemption: which lower-priority pods to evict, on which one node, so that a pod
that fits nowhere gets its slice (issue 38).

Modelled on kube-scheduler's default preemption (``DefaultPreemption``: candidates per node, all
lower-priority pods removed then as many as possible reprieved, the node chosen by ordered
criteria), but on shares of cards rather than whole nodes: a victim frees its claims' slices (the
memory, cores and slots, or whole cards, its allocations take), and whether the preemptor fits in
what was freed is the policy chain's answer, through the planner (``fits``). This module decides
only: ``select`` is pure over ``Site``s (the pods that hold our allocations on a node, typed) and
a ``fits`` oracle; ``sites_for`` reads them from the controller's cache; the evictions, the event,
the condition and the hold are ``preemptor.py``'s.

**Who may be a victim.** A pod of strictly lower priority that holds allocations of ours on the
node; never one of equal or higher priority. A claim shared by several pods is freed only when
every pod that uses it goes, so a claim also used by a pod that may not be preempted is never
counted as freed. A pod already terminating (a victim of an earlier preemption, say) frees its
claims at no cost, and so does a claim no live pod uses any more (its pods are gone, the claim
not released yet: an earlier preemption's victims, say): a node where those suffice is a
candidate with no new victims, where the preemptor waits for them (as kube-scheduler does with a
nominated node's terminating victims).
A pod whose eviction a PodDisruptionBudget refused is left out (``refused``): the Eviction API
cannot take it, so it is no victim.

**The cheapest set on a node.** All candidates removed: if the preemptor does not fit, the node is
out. Else each candidate is reprieved in turn, the most important first (higher priority, then
the longest running), if the preemptor still fits without evicting it: kube-scheduler's reprieve,
which leaves the cheapest pods as victims. Sets smaller than that are then searched exhaustively,
in cost order, within ``budget`` oracle calls per node, so the answer is the fewest victims the
budget can prove; the reprieve's set is the fallback.

**The node.** The cheapest candidate over all nodes, by (in order): fewest victims, the lowest
priority among them (the highest victim's), the lowest sum of their priorities, the least GPU
time lost (the sum of their ages: the youngest first), then the node's name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import combinations
from math import comb

from dra_driver.controller.allocator import Allocator, Unschedulable
from dra_driver.controller.cache import ClusterCache
from dra_driver.controller.reasons import Reason
from dra_driver.resource.objects import ClaimView, PodView
from dra_driver.resource.uses import Use

#: ``spec.preemptionPolicy`` of a pod that never has others preempted for it.
PREEMPT_NEVER = "Never"

#: Oracle calls (``fits``) one node may cost beyond the reprieve (the exhaustive search for fewer
#: victims stops there).
SEARCH_BUDGET = 16
#: Oracle calls one preemption may cost over all nodes: no further node is looked at past it. One
#: call plans the pod on one node (about 1 ms on a loaded 2-CPU machine, 8 cards of 4 shares:
#: hack/bench_preemption.py), so a preemption costs at most about half a second of the worker.
TOTAL_BUDGET = 400
#: A size of victim sets with more combinations than this is not searched exhaustively.
MAX_COMBINATIONS = 1024
#: The candidate nodes found, at most, before the cheapest is chosen (kube-scheduler looks at a
#: bounded number too).
MAX_CANDIDATE_NODES = 16


@dataclass(frozen=True, slots=True)
class Holder:
    """A pod that holds allocations of ours on a node: a possible victim."""

    key: str  # namespace/name
    uid: str
    priority: int
    #: When it was created (epoch seconds): the older, the more GPU time its eviction loses.
    started: float
    #: The uids of the claims it uses that have devices on the node.
    claims: frozenset[str]
    #: Terminating already: its claims are being freed, at no cost.
    going: bool = False
    #: The node its claims are on (a gang's victims span nodes).
    node: str = ""


@dataclass(frozen=True, slots=True)
class Site:
    """One node as preemption sees it: its possible victims, and who else uses each claim."""

    node: str
    holders: tuple[Holder, ...]
    #: Claim uid -> the keys of every live pod using it (holders or not): a claim is freed only
    #: when all of them go.
    users: Mapping[str, frozenset[str]] = field(default_factory=dict)
    #: Claims no live pod uses any more (their pods are gone, the claims not released yet): freed
    #: at no cost, like a terminating pod's (kube-controller-manager and the releaser free them).
    released: frozenset[str] = frozenset()

    def freed(self, going: Iterable[Holder]) -> frozenset[str]:
        """The claims freed when ``going`` (holders of this site) are gone, and those released."""
        keys = {holder.key for holder in going}
        claims = {claim for holder in going for claim in holder.claims}
        mine = (claim for claim in claims if self.users.get(claim, frozenset()) <= keys)
        return frozenset(mine) | self.released


#: ``fits(node, freed claim uids)``: whether the preemptor fits on ``node`` once those claims'
#: allocations are gone (the policy chain, node fit and quota included).
Fits = Callable[[str, frozenset[str]], bool]


@dataclass(frozen=True, slots=True)
class Candidate:
    """Victims on one node that make room for the preemptor (none: the terminating pods there
    already do)."""

    node: str
    victims: tuple[Holder, ...]
    #: The pods already terminating whose claims the preemptor's room counts on.
    waiting_for: tuple[Holder, ...] = ()
    #: The claims freed (the victims' and the terminating pods'), for the hold.
    freed: frozenset[str] = frozenset()
    now: float = 0.0

    def cost(self) -> tuple[int, int, int, float, str]:
        """Lower is cheaper: victims, their highest priority, their sum, GPU time lost, node."""
        return (*cost_of(self.victims, self.now), self.node)


def cost_of(victims: Sequence[Holder], now: float) -> tuple[int, int, int, float]:
    """(how many, the highest priority, the sum of priorities, seconds of GPU time lost)."""
    if not victims:
        return (0, -(2**31), 0, 0.0)
    return (
        len(victims),
        max(victim.priority for victim in victims),
        sum(victim.priority for victim in victims),
        sum(max(0.0, now - victim.started) for victim in victims),
    )


def _importance(holder: Holder) -> tuple[int, float, str]:
    """Reprieve order: the higher priority first, then the longest running (the oldest)."""
    return (-holder.priority, holder.started, holder.key)


def best_on(
    site: Site,
    priority: int,
    fits: Fits,
    *,
    now: float,
    refused: frozenset[str] = frozenset(),
    budget: int = SEARCH_BUDGET,
    reprieves: int | None = None,
) -> Candidate | None:
    """The cheapest victims on one node for a preemptor of ``priority``, or None when evicting
    every pod it may evict there would not make it fit. ``reprieves``: at most this many pods
    are tried for a reprieve (the rest stay victims: more victims than needed, never too few),
    for a site where each oracle call is costly (a gang's, ``select_joint``)."""
    going = tuple(holder for holder in site.holders if holder.going)
    eligible = [
        holder
        for holder in site.holders
        if not holder.going and holder.priority < priority and holder.key not in refused
    ]

    def room(victims: Sequence[Holder]) -> frozenset[str] | None:
        freed = site.freed((*going, *victims))
        return freed if fits(site.node, freed) else None

    if going or site.released:
        freed = room(())
        if freed is not None:
            return Candidate(site.node, (), going, freed, now)
    if not eligible or room(eligible) is None:
        return None
    victims = list(eligible)
    for tried, holder in enumerate(sorted(eligible, key=_importance)):  # kube-scheduler's reprieve
        if reprieves is not None and tried >= reprieves:
            break
        kept = [victim for victim in victims if victim is not holder]
        if room(kept) is not None:
            victims = kept
    victims = list(_fewer(victims, eligible, room, now, budget))
    freed = room(victims)
    assert freed is not None  # every set returned above was checked
    ordered = tuple(sorted(victims, key=lambda holder: (holder.priority, -holder.started, holder.key)))
    return Candidate(site.node, ordered, going, freed, now)


def _fewer(
    found: list[Holder],
    eligible: list[Holder],
    room: Callable[[Sequence[Holder]], frozenset[str] | None],
    now: float,
    budget: int,
) -> Sequence[Holder]:
    """A cheaper set than ``found`` (the reprieve's) where one exists within ``budget`` calls:
    smaller sets first, each size in cost order; ``found`` where none does."""
    best: Sequence[Holder] = found
    for size in range(1, len(found) + 1):
        if comb(len(eligible), size) > MAX_COMBINATIONS:
            return best
        sets = sorted(combinations(eligible, size), key=lambda victims: cost_of(victims, now))
        for victims in sets:
            if cost_of(victims, now) >= cost_of(best, now):
                return best  # the rest of this size cost more; larger sizes too
            if budget <= 0:
                return best
            budget -= 1
            if room(victims) is not None:
                return victims
    return best


def select(
    sites: Iterable[Site],
    priority: int,
    fits: Fits,
    *,
    now: float,
    refused: frozenset[str] = frozenset(),
    budget: int = SEARCH_BUDGET,
    max_nodes: int = MAX_CANDIDATE_NODES,
    total_budget: int = TOTAL_BUDGET,
) -> list[Candidate]:
    """The candidates over ``sites``, cheapest first (``Candidate.cost``); the first is the one to
    take, the next ones what to try when a PodDisruptionBudget refuses an eviction of it.

    Sites are looked at in the order given until ``max_nodes`` candidates are found or
    ``total_budget`` oracle calls are spent; none when no node looked at frees enough for the
    preemptor."""
    found: list[Candidate] = []
    calls = 0

    def counted(node: str, freed: frozenset[str]) -> bool:
        nonlocal calls
        calls += 1
        return fits(node, freed)

    for site in sites:
        if len(found) >= max_nodes or calls >= total_budget:
            break
        candidate = best_on(site, priority, counted, now=now, refused=refused, budget=budget)
        if candidate is not None:
            found.append(candidate)
    return sorted(found, key=Candidate.cost)


#: A gang's victims are looked for on this many nodes together at most (``select_joint``).
JOINT_MAX_NODES = 8
#: Pods tried for a reprieve in a gang's victim set (each try plans the whole gang).
JOINT_REPRIEVES = 24
#: Oracle calls of the search for fewer victims in a gang's victim set.
JOINT_SEARCH_BUDGET = 8

#: ``fits(freed claim uids)``: whether pods placed together (a gang) fit, each on any node it may
#: run on, once those claims' allocations are gone.
JointFits = Callable[[frozenset[str]], bool]


def merged(sites: Sequence[Site]) -> Site:
    """Several nodes as one site: pods placed together (a gang) may take room on any of them.
    Its ``node`` names them all (``node-1+node-2``); each holder keeps its own."""
    users: dict[str, frozenset[str]] = {}
    for site in sites:
        users.update(site.users)
    holders = tuple(holder for site in sites for holder in site.holders)
    released = frozenset().union(*(site.released for site in sites))
    return Site("+".join(site.node for site in sites), holders, users, released)


def select_joint(
    sites: Sequence[Site],
    priority: int,
    fits: JointFits,
    *,
    now: float,
    refused: frozenset[str] = frozenset(),
    max_nodes: int = JOINT_MAX_NODES,
    budget: int = JOINT_SEARCH_BUDGET,
    reprieves: int = JOINT_REPRIEVES,
) -> Candidate | None:
    """The victims for pods placed together, all or none (a gang), by the same rules as one
    pod's: ``sites`` are taken in their order (``sites_below``: terminating pods first, then the
    cheapest victims) one more at a time, until evicting every pod it may evict on them (strictly
    lower ``priority``, not ``refused``) makes the whole set fit; then ``best_on`` over those
    nodes together keeps the cheapest victims among them (the reprieve, then the bounded search
    for fewer). None when ``max_nodes`` sites are not enough. Bounded: at most
    2 x ``max_nodes`` + ``reprieves`` + ``budget`` calls of ``fits``, each a plan of the set."""
    for size in range(1, min(len(sites), max_nodes) + 1):
        candidate = best_on(
            merged(sites[:size]),
            priority,
            lambda _node, freed: fits(freed),
            now=now,
            refused=refused,
            budget=budget,
            reprieves=reprieves,
        )
        if candidate is not None:
            return candidate
    return None


# --- what preemption reads from the controller's cache ----------------------------------------------
def epoch(timestamp: str) -> float:
    """An RFC 3339 timestamp (``creationTimestamp``) in epoch seconds; 0 when unreadable."""
    try:
        return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def refusal(pod: PodView, reason: str) -> str | None:
    """Why ``pod``, pending for ``reason``, may not have others preempted for it (None: it may).

    Only a pod that fits nowhere for capacity preempts: a pod over its namespace's quota (or
    pending for its own input) would stay pending with the room made, and GpuQuota is never
    exceeded by preemption."""
    if pod.preemption_policy == PREEMPT_NEVER:
        return "its preemptionPolicy is Never"
    if reason != Reason.UNSCHEDULABLE:
        return f"it waits for {reason}, not for capacity"
    return None


def sites_for(
    cache: ClusterCache, preemptor: PodView, nodes: Iterable[str], going: Callable[[PodView], bool]
) -> list[Site]:
    """The ``Site`` of each of ``nodes`` (those where the preemptor may run) with a pod of lower
    priority than the preemptor's, or a terminating pod, holding allocations of ours there, in
    the order to look at them (``_promise``). ``going``: whether a pod is on
    its way out (terminating, or its eviction was just asked for)."""
    return sites_below(cache, preemptor.priority, frozenset({preemptor.key}), nodes, going)


def sites_below(
    cache: ClusterCache,
    priority: int,
    preemptors: frozenset[str],
    nodes: Iterable[str],
    going: Callable[[PodView], bool],
) -> list[Site]:
    """``sites_for`` for preemptors (by key: one pod, or a gang's members) of ``priority``: the
    pods of lower priority, or terminating, that hold allocations of ours on ``nodes``."""
    if not any(pod.priority < priority or going(pod) for pod in cache.pods.values()):
        return []  # nobody to evict, nothing terminating: the common case, without a claim read
    sites = []
    for node in sorted(nodes):
        holders: dict[str, tuple[PodView, set[str]]] = {}
        users: dict[str, frozenset[str]] = {}
        released: set[str] = set()
        for uid in cache.ledger.claims_on(node):
            claim = _claim(cache, uid)
            pods = _users(cache, claim) if claim is not None else []
            users[uid] = frozenset(pod.key for pod in pods) or frozenset({_NOBODY})
            if claim is not None and not pods and not cache.assumed.writing(claim.key):
                released.add(uid)
            for pod in pods:
                if pod.key not in preemptors and (pod.priority < priority or going(pod)):
                    holders.setdefault(pod.key, (pod, set()))[1].add(uid)
        if holders or released:
            found = tuple(
                Holder(pod.key, pod.uid, pod.priority, epoch(pod.created), frozenset(uids), going(pod), node)
                for pod, uids in holders.values()
            )
            sites.append(Site(node, found, users, frozenset(released)))
    sites.sort(key=_promise)
    return sites


def _promise(site: Site) -> tuple[bool, int, str]:
    """The order sites are looked at: those with terminating pods first (maybe nothing to evict),
    then those whose cheapest possible victim has the lowest priority, then by name."""
    going = bool(site.released) or any(holder.going for holder in site.holders)
    lowest = min((holder.priority for holder in site.holders if not holder.going), default=2**31)
    return (not going, lowest, site.node)


#: The user of a claim no live pod uses (being released): it is counted as freed at no cost
#: (``Site.released``), never as a victim's.
_NOBODY = "-"


def _claim(cache: ClusterCache, uid: str) -> ClaimView | None:
    key = cache.claim_keys_by_uid.get(uid)
    if key is None:
        return None
    namespace, _, name = key.partition("/")
    return cache.claim(namespace, name)


def _users(cache: ClusterCache, claim: ClaimView) -> list[PodView]:
    """The live pods that use ``claim``: those naming it and those it is reserved for."""
    found: dict[str, PodView] = {}
    for key in cache.consumers.get(claim.key, ()):
        pod = cache.pods.get(key)
        if pod is not None and pod.active:
            found[pod.key] = pod
    for uid in claim.reserved_uids:
        pod = cache.pod_by_uid(uid)
        if pod is not None and pod.active:
            found[pod.key] = pod
    return list(found.values())


def planner_fits(allocator: Allocator, pod: PodView, hidden: frozenset[str]) -> Fits:
    """``fits`` by the controller's own planner: the pod planned on the node with the freed
    claims (and ``hidden``: the holds it may take) left out of the ledger, quotas checked."""

    def fits(node: str, freed: frozenset[str]) -> bool:
        with allocator.cache.ledger.hiding(hidden | freed):
            return not isinstance(allocator.plan_on(pod, node), Unschedulable)

    return fits


def held_uses(
    allocator: Allocator, pod: PodView, candidate: Candidate, hidden: frozenset[str]
) -> tuple[Use, ...]:
    """What the pod would take on the candidate's node once its victims are gone: the capacity
    to hold for it while they terminate (empty if it no longer fits)."""
    with allocator.cache.ledger.hiding(hidden | candidate.freed):
        writes = allocator.plan_on(pod, candidate.node)
    if isinstance(writes, Unschedulable):
        return ()
    return tuple(use for write in writes for use in write.uses)


def candidates_for(
    allocator: Allocator,
    pod: PodView,
    *,
    hidden: frozenset[str] = frozenset(),
    going: Callable[[PodView], bool] = lambda pod: pod.deleting,
    refused: frozenset[str] = frozenset(),
    now: float,
) -> list[Candidate]:
    """Where the controller would preempt for ``pod`` (pending for capacity), cheapest first: the
    nodes it may run on (node fit), their holders of lower priority, the planner as the oracle.
    ``hidden``: the holds the pod may take (``Nominations.hidden_for``); ``refused``: pods whose
    eviction a PodDisruptionBudget refused."""
    sites = sites_for(allocator.cache, pod, allocator.allowed_nodes(pod), going)
    return select(sites, pod.priority, planner_fits(allocator, pod, hidden), now=now, refused=refused)
