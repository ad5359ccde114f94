"""Small building blocks shared by the broker and the storage layers (no magnetar imports here)."""
