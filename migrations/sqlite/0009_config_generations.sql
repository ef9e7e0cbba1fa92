-- Each config put in force (at a start or a reload) whose live part
-- differs from the one before: every replica applies the latest.
create table config_generations (
    generation integer primary key,
    digest text not null,
    live text not null,
    loaded_at integer not null,
    loaded_by text not null,
    how text not null
);
