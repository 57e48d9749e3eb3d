-- A forget no longer keeps the identifiers it forgot. The tombstones (what the pipeline refuses from now on)
-- and the audit record held the forgotten user, agent or session id in clear: a deployment that forgot a
-- person still named them. Those kinds are now stored as a one-way digest of (workspace, kind, id): enough
-- to refuse an event that names the id and to show, given the id, that it was forgotten; the id itself is
-- not kept. A drawer's tombstone is its id, already a digest of its content; the workspace's is '*'.
-- One definition, used by every statement that writes or looks a tombstone up (shared/db/forget.py,
-- shared/db/dreaming.py); immutable and in SQL, so it is inlined and a lookup stays a primary-key probe.
CREATE OR REPLACE FUNCTION palace_forget_key(ws text, kind text, value text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
    SELECT CASE WHEN kind IN ('user', 'agent', 'session')
                THEN 'sha256:' || encode(sha256(convert_to(ws || chr(31) || kind || chr(31) || value, 'UTF8')), 'hex')
                ELSE value END
$$;

UPDATE forget_tombstones SET value = palace_forget_key(workspace_id, kind, value)
 WHERE kind IN ('user', 'agent', 'session') AND value NOT LIKE 'sha256:%';
UPDATE forget_audit SET scope_value = palace_forget_key(workspace_id, scope_kind, scope_value)
 WHERE scope_kind IN ('user', 'agent', 'session') AND scope_value NOT LIKE 'sha256:%';
