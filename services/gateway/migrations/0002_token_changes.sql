-- Gateways cache verified API tokens; any change that can withdraw a token (revocation, expiry, role, team, secret,
-- deletion) is announced on channel gpupool_gateway_tokens so every gateway replica drops its cached copy at once,
-- whoever made the change (the API or SQL by hand). last_used_at updates stay silent.
CREATE FUNCTION gateway_token_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('gpupool_gateway_tokens', OLD.token_id);
    RETURN NULL;
END $$;

CREATE TRIGGER api_tokens_changed AFTER UPDATE ON api_tokens FOR EACH ROW
    WHEN (OLD.revoked_at IS DISTINCT FROM NEW.revoked_at OR OLD.expires_at IS DISTINCT FROM NEW.expires_at
          OR OLD.role IS DISTINCT FROM NEW.role OR OLD.team IS DISTINCT FROM NEW.team
          OR OLD.secret_hash IS DISTINCT FROM NEW.secret_hash OR OLD.name IS DISTINCT FROM NEW.name
          OR OLD.token_id IS DISTINCT FROM NEW.token_id)
    EXECUTE FUNCTION gateway_token_changed();

CREATE TRIGGER api_tokens_deleted AFTER DELETE ON api_tokens FOR EACH ROW
    EXECUTE FUNCTION gateway_token_changed();
