//! What a congestion run measured (to be written).
