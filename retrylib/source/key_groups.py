"""Offset ranges grouped so that each key's records are read by one task (`retry.key_ordered`).

A key lives in one main-topic partition p; its retries go to partition p mod n of each tier
topic with n partitions. A key group joins every range of a main partition with the ranges
of those tier partitions, and with everything those join in turn (a tier with fewer
partitions than its main topic joins several main partitions). A group's tier ranges come
first, so records already waiting are seen before the key's new ones.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from retrylib.kafka.offsets import OffsetRange, PartitionKey
from retrylib.retry.policy import tiers_of


def key_groups(
    ranges: Sequence[OffsetRange],
    tiers: Mapping[str, Sequence[str]],
    partitions: Iterable[PartitionKey],
) -> tuple[list[list[OffsetRange]], dict[PartitionKey, int]]:
    """`ranges` in key groups, each in reading order (tier ranges, then main ones), and the
    group that holds the keys of each main partition with ranges in one.

    `tiers` maps a main topic (or `ANY_TOPIC`) to its tier topics; `partitions` is every
    partition read, main and tier, whether it has a range or not: a main partition without
    one still joins the tier partitions its keys' retries wait in.
    """
    tier_topics = {topic for topics in tiers.values() for topic in topics}
    parent = {key: key for key in partitions}
    parent.update({(r.topic, r.partition): (r.topic, r.partition) for r in ranges})
    counts = Counter(topic for topic, _ in parent)

    def root(node: PartitionKey) -> PartitionKey:
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    for node in list(parent):
        topic, partition = node
        if topic in tier_topics:
            continue
        for tier in tiers_of(tiers, topic) or ():
            if counts[tier]:
                parent[root((tier, partition % counts[tier]))] = root(node)
    by_root: dict[PartitionKey, list[OffsetRange]] = {}
    for offset_range in ranges:
        by_root.setdefault(root((offset_range.topic, offset_range.partition)), []).append(
            offset_range
        )
    index = {key: i for i, key in enumerate(by_root)}
    groups = [
        sorted(group, key=lambda r: (r.topic not in tier_topics, r.topic, r.partition, r.start))
        for group in by_root.values()
    ]
    main_groups = {
        node: index[root(node)]
        for node in parent
        if node[0] not in tier_topics and root(node) in index
    }
    return groups, main_groups
