-- Wake-ups for the loops that would otherwise poll: claim loops LISTEN on
-- workflow_run_queued, relays on workflow_run_outbox. Notifications carry no
-- payload and Postgres folds duplicates within a transaction, so a sweep that
-- requeues a thousand rows still sends one. Polling stays the fallback: a
-- notification only shortens the wait, so a listener must never depend on one.

CREATE FUNCTION workflow_run_notify_queued() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('workflow_run_queued', '');
    RETURN NULL;
END
$$;

-- Only rows that are claimable right now: a retry whose run_after lies in the
-- future would wake every loop for nothing.
CREATE TRIGGER workflow_run_queued_notify
    AFTER INSERT OR UPDATE OF status, run_after ON workflow_run
    FOR EACH ROW
    WHEN (NEW.status = 'QUEUED' AND NEW.run_after <= now())
    EXECUTE FUNCTION workflow_run_notify_queued();

CREATE FUNCTION workflow_run_notify_outbox() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('workflow_run_outbox', '');
    RETURN NULL;
END
$$;

-- NOTIFY serializes the commits that send one (Postgres holds a database-wide
-- lock from queueing the notification until the commit is flushed), so the
-- hot path must not notify on every step. Step checkpoints therefore wake no
-- one: a busy relay is draining anyway, and an idle one picks them up on its
-- next pass. The events someone waits for (accepted, parked, settled) wake it
-- at once; ACCEPTED shares its transaction with the queued notification, so it
-- costs nothing extra. Per row rather than per statement: a fenced write that
-- lost its lease inserts nothing and must not wake anyone.
CREATE TRIGGER workflow_run_events_outbox_notify
    AFTER INSERT ON workflow_run_events_outbox
    FOR EACH ROW
    WHEN (NEW.event_type <> 'STEP_CHECKPOINT')
    EXECUTE FUNCTION workflow_run_notify_outbox();
