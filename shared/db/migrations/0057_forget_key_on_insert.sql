-- Every tombstone and forget audit record is keyed by palace_forget_key (0056) as it is inserted, whoever
-- inserts it: writers pass the id they were asked to forget, and a pod of an earlier release still running
-- during a rolling upgrade (which writes the id in clear) is covered the same way. Insert only: the audit row
-- is updated later (counts, status), and its key must not be keyed again.
CREATE OR REPLACE FUNCTION palace_forget_key_on_insert() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF TG_TABLE_NAME = 'forget_tombstones' THEN
        NEW.value := palace_forget_key(NEW.workspace_id, NEW.kind, NEW.value);
    ELSE
        NEW.scope_value := palace_forget_key(NEW.workspace_id, NEW.scope_kind, NEW.scope_value);
    END IF;
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS forget_tombstones_key ON forget_tombstones;
CREATE TRIGGER forget_tombstones_key BEFORE INSERT ON forget_tombstones
    FOR EACH ROW EXECUTE FUNCTION palace_forget_key_on_insert();
DROP TRIGGER IF EXISTS forget_audit_key ON forget_audit;
CREATE TRIGGER forget_audit_key BEFORE INSERT ON forget_audit
    FOR EACH ROW EXECUTE FUNCTION palace_forget_key_on_insert();
