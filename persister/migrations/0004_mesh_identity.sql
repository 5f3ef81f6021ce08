-- The mesh this database belongs to: one row, written by the first persister that
-- starts on the database (`persister/mesh_identity.py`). A persister of another mesh
-- (another OMS_MESH_ID) is refused before it writes any of the mesh's data. When the
-- mesh's logs are in etcd the database's uid is recorded there too
-- (`/oms/v1/<mesh>/identity`) and `etcd_bound_at` here: an etcd whose namespace is
-- bound to another database is refused, and so is an etcd without the key once this
-- database was bound (the logs it was written from are gone).
CREATE TABLE mesh_identity (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    mesh_id text NOT NULL,
    database_uid text NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now(),
    etcd_bound_at timestamptz
);
