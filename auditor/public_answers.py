"""What the admin API answers for every user: the auditor's view of the shards.

`ListUsers` (the admin API's, as an operator calls it) gives each user's balances as
its shard holds them now when the user is resident, else as PostgreSQL stores them,
and how many orders it has open. The auditor pages through all of them.
"""

from __future__ import annotations

from auditor.core.rows import UserAnswer
from gateway.client import AdminClient

PAGE_USERS = 1_000


async def answered_users(admin: AdminClient) -> list[UserAnswer]:
    answers: list[UserAnswer] = []
    after = 0
    while True:
        page = await admin.list_users(after_user_id=after, limit=PAGE_USERS)
        for user in page.users:
            answers.append(
                UserAnswer(
                    user.user_id,
                    user.resident,
                    {b.asset: (b.total, b.reserved) for b in user.balances},
                    user.open_orders,
                )
            )
        if not page.more or not page.users:
            return answers
        after = page.users[-1].user_id
