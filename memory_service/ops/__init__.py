"""Operations on a data dir: backup and restore, reindex (vectors rebuilt from the journal), the store-to-store copy behind migrate, and doctor."""
