"""A seeded, realistic command mix around the BTC-USDT reference, over several OMS shards.

70 % passive limits 1-5 ticks off the reference, 15 % crossing limits 1-4 ticks
through it (half IOC, half GTC), 15 % cancels of random earlier orders (resting
or finished). Users and shards are drawn at random, so orders of different
shards trade with each other and self-trade prevention happens too.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from protos.oms.v1 import matcher_pb2
from tests.matcher_service.matcher_messages import (
    BTC,
    BUY,
    GTC,
    IOC,
    REFERENCE_TICKS,
    SELL,
    OrderFactory,
    batch,
    cancel,
    submit,
)

REFERENCE = REFERENCE_TICKS[BTC]


class OrderMix:
    def __init__(self, factories: Sequence[OrderFactory], users: Sequence[int], seed: int) -> None:
        self.factories = factories
        self.users = users
        self.random = random.Random(seed)
        self.submitted: list[matcher_pb2.Order] = []

    def order(self) -> matcher_pb2.Order:
        draw = self.random.random()
        side = self.random.choice((BUY, SELL))
        factory = self.random.choice(self.factories)
        user_id = self.random.choice(self.users)
        quantity = self.random.randint(1, 5)
        if draw < 70 / 85:
            distance = self.random.randint(1, 5)
            price = REFERENCE - distance if side == BUY else REFERENCE + distance
            order = factory.limit(user_id, side, price, quantity, symbol=BTC)
        else:
            through = self.random.randint(1, 4)
            price = REFERENCE + through if side == BUY else REFERENCE - through
            tif = self.random.choice((IOC, GTC))
            order = factory.limit(user_id, side, price, quantity, time_in_force=tif, symbol=BTC)
        self.submitted.append(order)
        return order

    def command(self) -> matcher_pb2.MatcherCommand:
        if self.submitted and self.random.random() < 0.15:
            return cancel(self.random.choice(self.submitted[-500:]))
        return submit(self.order())

    def batch(self, size: int) -> matcher_pb2.MatcherCommandBatch:
        return batch(*(self.command() for _ in range(size)))

    def batches(self, count: int, size: int) -> list[matcher_pb2.MatcherCommandBatch]:
        return [self.batch(size) for _ in range(count)]
