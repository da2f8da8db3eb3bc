-- Room on each page for a job's next row versions. A step checkpoint changes
-- no indexed column, so its new version can be a heap-only tuple (no new entry
-- in any of the table's indexes) when it fits on the same page. With full pages
-- (the default fillfactor of 100, rows of about 2 kB with the definition
-- snapshot) most checkpoints had to add an entry to every index instead. At 70
-- most of them stay heap-only: less WAL and less server CPU per job, and the
-- table grows no larger, since the dead versions of non-HOT updates took that
-- space anyway. Applies to pages written from now on; nothing is rewritten.
ALTER TABLE workflow_run SET (fillfactor = 70);
