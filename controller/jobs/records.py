"""The job book's records: a job forgotten (after it is stopped), finished jobs pruned. Steps of the loop (calls)."""

from __future__ import annotations

from controller.jobs.book import JobBook
from controller.jobs.inbox import Inbox, Reply


class Records:
    def __init__(self, book: JobBook, inbox: Inbox):
        self.book, self.inbox = book, inbox

    def forget(self, reply: Reply, job_id: str) -> None:
        """Forget an ended job (UnknownJob if there is none of that id); answers its last record."""
        job = self.book.get(job_id)
        self.book.forget([job_id])
        reply.set(job)

    def prune(self, reply: Reply, older_than_s: float | None, keep: int | None) -> None:
        """Forget finished jobs that ended over `older_than_s` ago, keeping the newest `keep`; answers their ids."""
        reply.set(self.book.prune(older_than_s, keep))
