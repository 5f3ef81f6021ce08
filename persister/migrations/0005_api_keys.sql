-- API keys as exchanges issue them: several per user, HMAC or Ed25519, with scopes,
-- an optional expiry and a revocation (`persister/api_keys.py`). An HMAC secret is
-- kept sealed under the persister's master key (`sealed_secret`, `secret_seal.py`);
-- the plaintext column is only read for rows written before this migration, which
-- the persister seals at its start (then `secret` is NULL). An Ed25519 key keeps
-- only the user's 32-byte public key.
ALTER TABLE api_keys ALTER COLUMN secret DROP NOT NULL;
ALTER TABLE api_keys
    ADD COLUMN kind text NOT NULL DEFAULT 'hmac' CHECK (kind IN ('hmac', 'ed25519')),
    ADD COLUMN sealed_secret bytea,
    ADD COLUMN public_key bytea,
    ADD COLUMN scopes text[] NOT NULL DEFAULT ARRAY['read', 'trade']
        CHECK (cardinality(scopes) > 0 AND scopes <@ ARRAY['read', 'trade']),
    ADD COLUMN expires_at timestamptz,
    ADD COLUMN revoked_at timestamptz,
    ADD COLUMN label text NOT NULL DEFAULT '' CHECK (char_length(label) <= 64),
    ADD COLUMN created_by text NOT NULL DEFAULT '',
    ADD COLUMN revoked_by text,
    ADD CONSTRAINT api_keys_verifier CHECK (
        (kind = 'hmac' AND public_key IS NULL
            AND (secret IS NOT NULL OR sealed_secret IS NOT NULL))
        OR (kind = 'ed25519' AND secret IS NULL AND sealed_secret IS NULL
            AND octet_length(public_key) = 32)
    ),
    -- A revoked key is disabled too: `enabled` stays what older readers check.
    ADD CONSTRAINT api_keys_revoked_disabled CHECK (revoked_at IS NULL OR NOT enabled);

-- Who did what to the system, and when: one row per administrative change (API keys
-- here), written in the transaction of the change itself.
CREATE TABLE admin_audit (
    audit_id bigserial PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT now(),
    actor text NOT NULL CHECK (actor <> ''),
    action text NOT NULL CHECK (action <> ''),
    user_id bigint,
    subject text NOT NULL DEFAULT '',
    detail jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX admin_audit_user ON admin_audit (user_id, at);
