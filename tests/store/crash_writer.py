"""A host stand-in for the crash tests: admit one user message, announce it, then keep
writing assistant rows until killed. With ``delete``, it deletes the task once the message is
in, announces that instead, and keeps writing to a second task until killed.

Usage: python crash_writer.py STORE_FILE TASK_ID MESSAGE [delete]
"""

from __future__ import annotations

import sys

import trio

from maple_acp.store import (
    ItemKind,
    SqliteTaskStore,
    TaskRecord,
    TaskSurface,
    TimelineItem,
)


async def main(path: str, task_id: str, message: str, mode: str = "") -> None:
    store = await SqliteTaskStore.open(path)
    await store.create_task(
        TaskRecord(
            id=task_id,
            account="account",
            root="/project",
            created_ms=1,
            updated_ms=1,
            surface=TaskSurface.EXTERNAL,
            provisional=True,
        )
    )
    await store.admit_user_message(
        task_id,
        TimelineItem(item_id="user-1", kind=ItemKind.USER, created_ms=2, text=message),
        now_ms=2,
    )
    if mode == "delete":
        if not await store.delete_task(task_id):
            raise SystemExit("the task was not deleted")
        task_id = f"{task_id}-other"
        await store.create_task(
            TaskRecord(
                id=task_id,
                account="account",
                root="/project",
                created_ms=1,
                updated_ms=1,
                surface=TaskSurface.DESKTOP,
            )
        )
        sys.stdout.write("DELETED\n")
    else:
        sys.stdout.write("ADMITTED\n")
    sys.stdout.flush()
    n = 0
    while True:
        n += 1
        await store.upsert_items(
            task_id,
            [
                TimelineItem(
                    item_id=f"assistant-{n}",
                    kind=ItemKind.ASSISTANT,
                    created_ms=n,
                    text="chunk " * 50,
                )
            ],
            now_ms=2 + n,
        )


if __name__ == "__main__":
    trio.run(main, *sys.argv[1:5])
