"""Encrypted payloads with a real worker process: its handler gets the plaintext, and a
payload no key opens is dead-lettered once, not crash-looped."""

import pytest
from cryptography.fernet import Fernet

from queue_app import enqueue
from queue_app.handlers import registry
from queue_app.models import DeadLetter, Job, State
from queue_app.worker.execution import UNDECRYPTABLE
from tests.worker_support import run_worker

pytestmark = pytest.mark.django_db(transaction=True)

CARD = "4111111111111111"
KEY, LOST = Fernet.generate_key().decode(), Fernet.generate_key().decode()


def charge(payload):
    return {"card_ok": payload["card"] == CARD, "amount": payload["amount"]}


def test_a_real_worker_opens_the_payload_and_dead_letters_one_no_key_opens(settings):
    registry.register("charge", charge, encrypt=("card",))
    settings.JOBQUEUE = {**settings.JOBQUEUE, "ENCRYPTION_KEYS": [LOST]}
    orphan = enqueue("charge", {"card": CARD, "amount": 1}, max_attempts=5)
    settings.JOBQUEUE = {**settings.JOBQUEUE, "ENCRYPTION_KEYS": [KEY]}
    good = enqueue("charge", {"card": CARD, "amount": 2})

    assert run_worker(burst=True, within=60) == 0

    good, orphan = Job.objects.get(id=good.id), Job.objects.get(id=orphan.id)
    assert (good.state, good.result) == (State.COMPLETED, {"card_ok": True, "amount": 2})
    assert (orphan.state, orphan.attempts) == (State.DEAD_LETTER, 1)
    assert DeadLetter.objects.get(job=orphan).reason == UNDECRYPTABLE
