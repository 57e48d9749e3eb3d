-- API keys are looked up by their public key id before the constant-time hash comparison.
CREATE INDEX IF NOT EXISTS api_keys_key_id ON api_keys (key_id);
