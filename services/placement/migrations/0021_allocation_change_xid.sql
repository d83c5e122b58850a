-- Which transaction last changed a live allocation. A cycle keeps the live allocations in memory and re-reads
-- only rows changed by transactions its previous read could not see, as it does for the wanted jobs (0007): with
-- thousands running, reading and decoding every allocation with its GPUs every cycle was most of a cycle's read.
-- Any change stamps it (what a cycle reads of an allocation is most of it). An allocation's GPU shares are
-- written with it and change only with its release, which changes the allocation too. Rows written before this
-- migration carry 0 and are read by the first cycle anyway.
ALTER TABLE allocations ADD COLUMN changed_xid xid8 NOT NULL DEFAULT '0';

CREATE FUNCTION allocations_stamp_xid() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.changed_xid := pg_current_xact_id();
    RETURN NEW;
END $$;

CREATE TRIGGER allocations_stamp_xid BEFORE INSERT OR UPDATE ON allocations
    FOR EACH ROW EXECUTE FUNCTION allocations_stamp_xid();
