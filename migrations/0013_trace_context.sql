-- The W3C trace context a job was submitted with (the submit's own span when
-- the submitting process traces, else what the client sent), so the spans of
-- its segments and the headers of its events continue that trace wherever
-- they run. NULL: the job was submitted without one.
ALTER TABLE workflow_run
    ADD COLUMN traceparent text,
    ADD COLUMN tracestate  text;
