"""One GPU, one owner: which OmniService gets a node that several of them select.

Pure functions. Every OmniService the operator sees is a `Claim`. A claim contends for a node
only where it can actually serve (the caller decides: labels, tolerated taints, its
RuntimeClass and PriorityClass present), so an OmniService that can never run a pod on a node
never blocks one that can. On a node offering `g` GPUs the first `g` contenders win, in this
order:

1. a claim with a pod on the node already (live or terminating): a node changes hands only
   when it is free, so a selector edit never evicts another OmniService's pod;
2. then `Claim.order`: oldest `creationTimestamp` first, then namespace, name and uid.

The rest get no pod there and a `Conflict` condition naming the node and the winner. The
order is a total order over facts every pass sees alike, so all reconcilers agree without
talking to each other, and a restart changes nothing. An OmniService deleted and applied
again is a new claim (new uid, new creationTimestamp): it is ordered as the youngest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping


@dataclasses.dataclass(frozen=True)
class Claim:
    namespace: str
    name: str
    uid: str
    created: str  # metadata.creationTimestamp (RFC 3339, so it sorts as text)

    @property
    def order(self) -> tuple[str, str, str, str]:
        return (self.created, self.namespace, self.name, self.uid)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def lost_nodes(
    me: Claim,
    wanted: Mapping[Claim, Iterable[str]],
    gpus: Mapping[str, int],
    occupants: Mapping[str, Iterable[str]] | None = None,
) -> dict[str, Claim]:
    """The nodes `me` wants but loses, each with the first winner there.

    `wanted` maps every claim (including `me`) to the nodes it can serve on; `gpus` is the
    number of GPUs each node offers (one serving pod per GPU); `occupants` maps a node to the
    uids of the claims with a pod there.
    """
    occupants = occupants or {}
    mine = set(wanted.get(me, ()))
    contenders: dict[str, list[Claim]] = {n: [me] for n in mine}
    for claim, nodes in wanted.items():
        if claim.uid == me.uid:
            continue
        for node in nodes:
            if node in contenders:
                contenders[node].append(claim)
    lost: dict[str, Claim] = {}
    for node, claims in contenders.items():
        if len(claims) == 1:
            continue
        sitting = set(occupants.get(node, ()))
        claims.sort(key=lambda c: (c.uid not in sitting, c.order))
        winners = claims[: max(1, gpus.get(node, 1))]
        if me not in winners:
            lost[node] = winners[0]
    return lost
