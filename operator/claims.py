"""One GPU, one owner: which OmniService gets a node that several of them select.

Pure functions. Every OmniService the operator sees is a `Claim`; on a node offering `g`
GPUs the first `g` claims in `Claim.order` (oldest first, then namespace and name) win, the
rest get no pod there and a `Conflict` condition naming the node and the winner. The order is
a total order over facts every pass sees alike, so all reconcilers agree without talking to
each other, and a restart changes nothing.
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
    def order(self) -> tuple[str, str, str]:
        return (self.created, self.namespace, self.name)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def lost_nodes(
    me: Claim,
    wanted: Mapping[Claim, Iterable[str]],
    gpus: Mapping[str, int],
) -> dict[str, Claim]:
    """The nodes `me` wants but loses, each with the first winner there.

    `wanted` maps every claim (including `me`) to the nodes it would serve on; `gpus` is the
    number of GPUs each node offers (one serving pod per GPU).
    """
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
        claims.sort(key=lambda c: c.order)
        winners = claims[: max(1, gpus.get(node, 1))]
        if me not in winners:
            lost[node] = winners[0]
    return lost
