"""Sensitive payloads encrypted at rest (core/encryption.py): the stored row holds no
plaintext, the handler gets it, rotation keeps old rows readable, and a payload no key
opens is dead-lettered at once with that reason."""

import json

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from queue_app import enqueue
from queue_app.checks import encryption_options
from queue_app.core import encryption, transitions
from queue_app.exceptions import InvalidJob
from queue_app.handlers import registry
from queue_app.models import DeadLetter, Job, State
from queue_app.worker.execution import UNDECRYPTABLE, run_one
from tests import sample_tasks

pytestmark = pytest.mark.django_db

CARD = "4111111111111111"
OLD, NEW = Fernet.generate_key().decode(), Fernet.generate_key().decode()


@pytest.fixture
def keys(settings):
    def use(*keys, **more):
        settings.JOBQUEUE = {**settings.JOBQUEUE, "ENCRYPTION_KEYS": list(keys), **more}

    use(OLD)
    return use


@pytest.fixture
def seen():
    """Register the kind "charge" (its card encrypted); return the payloads it ran with."""
    payloads = []

    def charge(payload):
        payloads.append(payload)
        return {"charged": payload.get("amount")}

    registry.register("charge", charge, encrypt=("card",))
    return payloads


def stored(table, column, row_id):
    """A column's text as the database holds it, read with a plain SELECT."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column} FROM {table} WHERE id = %s", [row_id])
        value = cursor.fetchone()[0]
    return value if isinstance(value, str) else json.dumps(value)


def test_an_encrypted_field_is_not_in_the_stored_row_and_the_handler_gets_it(keys, seen):
    job = enqueue("charge", {"card": CARD, "amount": 5})

    raw = stored("queue_app_job", "payload", job.id)
    assert CARD not in raw
    assert encryption.MARKER in raw
    assert '"amount"' in raw  # what is not declared secret stays readable
    done = run_one()
    assert done.state == State.COMPLETED
    assert seen == [{"card": CARD, "amount": 5}]
    assert CARD not in stored("queue_app_job", "payload", job.id)  # running it wrote none back


def test_a_whole_payload_kind_from_the_settings_is_stored_as_one_token(keys, seen):
    keys(OLD, ENCRYPTED_KINDS={"vault": True})
    opened = []
    registry.register("vault", lambda payload: opened.append(payload))

    job = enqueue("vault", {"user": "ann", "pin": "9876"})

    raw = stored("queue_app_job", "payload", job.id)
    assert "ann" not in raw and "9876" not in raw and "pin" not in raw
    assert set(Job.objects.get(id=job.id).payload) == {encryption.MARKER}
    run_one()
    assert opened == [{"user": "ann", "pin": "9876"}]


def test_a_task_argument_is_encrypted_by_keyword_and_by_position(keys):
    by_keyword = sample_tasks.charge.enqueue(card=CARD, amount=3)
    by_position = sample_tasks.charge.enqueue(CARD, 4)

    for result in (by_keyword, by_position):
        assert CARD not in stored("queue_app_job", "payload", int(result.id))
    assert run_one().result == {"last4": "1111", "amount": 3}
    assert run_one().result == {"last4": "1111", "amount": 4}


def test_a_rotated_key_still_decrypts_and_reencrypt_moves_rows_to_the_new_key(keys, seen):
    first = enqueue("charge", {"card": CARD, "amount": 1})
    second = enqueue("charge", {"card": CARD, "amount": 2})
    before = stored("queue_app_job", "payload", second.id)
    keys(NEW, OLD)  # the new key goes first; the old one still decrypts

    run_one()
    assert seen[0]["card"] == CARD
    call_command("reencrypt")

    after = stored("queue_app_job", "payload", second.id)
    assert after != before and CARD not in after
    token = Job.objects.get(id=second.id).payload["card"][encryption.MARKER]
    assert json.loads(Fernet(NEW).decrypt(token.encode())) == CARD
    keys(NEW)  # the old key dropped: the rotated row still opens
    run_one()
    assert [p["card"] for p in seen] == [CARD, CARD]
    assert Job.objects.get(id=first.id).state == State.COMPLETED


def test_reencrypt_leaves_rows_already_under_the_first_key_alone(keys, seen):
    job = enqueue("charge", {"card": CARD})
    before = stored("queue_app_job", "payload", job.id)

    assert transitions.reencrypt() == {"jobs": 0, "dead_letters": 0, "events": 0, "tokens": 0}
    assert stored("queue_app_job", "payload", job.id) == before


def test_a_payload_no_key_opens_is_dead_lettered_at_once_with_that_reason(keys, seen):
    job = enqueue("charge", {"card": CARD}, max_attempts=3)
    keys(NEW)  # the key it was encrypted with is gone

    done = run_one()

    assert done.state == State.DEAD_LETTER
    assert done.attempts == 1  # not retried: no retry can open it
    assert seen == []
    letter = DeadLetter.objects.get(job=job)
    assert letter.reason == UNDECRYPTABLE
    assert "cannot be decrypted" in letter.error["message"]
    assert "ENCRYPTION_KEYS" in letter.error["message"]
    assert CARD not in stored("queue_app_deadletter", "payload", letter.id)


def test_an_encrypted_kind_is_refused_at_enqueue_without_a_key(keys, seen):
    keys()
    with pytest.raises(InvalidJob, match="ENCRYPTION_KEYS"):
        enqueue("charge", {"card": CARD})
    assert not Job.objects.exists()


def test_an_edited_or_requeued_payload_stays_encrypted(keys, seen):
    job = enqueue("charge", {"card": CARD})
    transitions.change_payload(job.id, {"card": "5500000000000004", "amount": 9})
    assert "5500000000000004" not in stored("queue_app_job", "payload", job.id)
    registry.unregister("charge")  # a process that never declared the kind: the row says what
    transitions.change_payload(job.id, {"card": "378282246310005"})
    assert "378282246310005" not in stored("queue_app_job", "payload", job.id)
    assert encryption.unseal(Job.objects.get(id=job.id).payload) == {"card": "378282246310005"}


def test_sealing_a_payload_that_holds_tokens_opens_them_first(keys, seen):
    once = encryption.seal("charge", {"card": CARD})
    twice = encryption.seal("charge", {**once, "parent": {"id": 1}})  # a follow-up's shape

    assert encryption.unseal(twice) == {"card": CARD, "parent": {"id": 1}}
    declared = encryption.seal("charge", {"card": CARD}, like={encryption.MARKER: "x"})
    assert encryption.is_token(declared["card"])  # the kind's declaration wins over the old row


def test_bad_encryption_settings_fail_the_checks(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "ENCRYPTION_KEYS": ["not-a-key"]}
    assert [e.id for e in encryption_options()] == ["queue_app.E003"]
    settings.JOBQUEUE = {**settings.JOBQUEUE, "ENCRYPTION_KEYS": [], "ENCRYPTED_KINDS": {"x": 5}}
    assert sorted(e.id for e in encryption_options()) == ["queue_app.E004", "queue_app.E005"]


def test_a_bad_encrypt_option_is_refused_where_it_is_declared():
    with pytest.raises(TypeError, match="encrypt must be True"):
        registry.register("charge", print, encrypt=[1])


def test_reencrypt_rotates_the_previous_payload_kept_on_an_edit_event(keys, seen):
    job = enqueue("charge", {"card": CARD})
    transitions.change_payload(job.id, {"card": CARD, "amount": 2})
    keys(NEW, OLD)

    counts = transitions.reencrypt()

    assert (counts["jobs"], counts["events"]) == (1, 1)
    keys(NEW)
    event = job.events.get(type="payload_changed")
    assert encryption.unseal(event.metadata["previous_payload"]) == {"card": CARD}


def test_reencrypt_exits_1_naming_the_keys_when_no_key_opens_a_row(keys, seen):
    enqueue("charge", {"card": CARD})
    keys(NEW)

    with pytest.raises(CommandError) as failed:
        call_command("reencrypt")

    assert failed.value.returncode == 1
    assert "ENCRYPTION_KEYS" in str(failed.value)
