//! The two backends ([`Backend`]: which database a URL names) and SQL text
//! built together with its arguments, for both.
//!
//! sqlx's `QueryBuilder<Any>` writes `?` placeholders, which PostgreSQL
//! does not accept. The store's fixed statements use numbered `$N`
//! placeholders: PostgreSQL's own form, and one sqlx's SQLite driver binds
//! by number too. Statements built here can have thousands of arguments
//! (multi-row inserts), and SQLite looks a named parameter up by a linear
//! scan, so that binding `$N` ones is quadratic (it halved create
//! throughput); this builder writes plain `?` for SQLite and `$N` for
//! PostgreSQL.

use std::fmt::Write;

use sqlx::any::{Any, AnyArguments, AnyQueryResult, AnyRow};
use sqlx::{Arguments, Encode, Executor, Type};

use super::StoreError;

/// Which database a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    pub fn of_url(url: &str) -> Result<Backend, StoreError> {
        if url.starts_with("sqlite:") {
            Ok(Backend::Sqlite)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Backend::Postgres)
        } else {
            Err(StoreError::Unavailable(format!(
                "database.url {:?}: expected sqlite:PATH or postgres://HOST/DATABASE",
                crate::config::redact_url(url)
            )))
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

/// A statement being built.
pub(super) struct Sql<'a> {
    backend: Backend,
    text: String,
    args: AnyArguments<'a>,
    /// The first argument that could not be encoded.
    error: Option<String>,
}

impl<'a> Sql<'a> {
    pub(super) fn new(backend: Backend, text: impl Into<String>) -> Sql<'a> {
        Sql {
            backend,
            text: text.into(),
            args: AnyArguments::default(),
            error: None,
        }
    }

    /// Appends SQL text.
    pub(super) fn push(&mut self, text: &str) -> &mut Self {
        self.text.push_str(text);
        self
    }

    /// Appends a placeholder and binds `value` to it.
    pub(super) fn bind<T>(&mut self, value: T) -> &mut Self
    where
        T: 'a + Encode<'a, Any> + Type<Any>,
    {
        if let Err(e) = self.args.add(value) {
            self.error.get_or_insert(e.to_string());
        }
        match self.backend {
            Backend::Sqlite => self.text.push('?'),
            Backend::Postgres => {
                let _ = write!(self.text, "${}", self.args.len());
            }
        }
        self
    }

    /// Appends `v1, v2, ...`, each bound.
    pub(super) fn list<T, I>(&mut self, values: I) -> &mut Self
    where
        I: IntoIterator<Item = T>,
        T: 'a + Encode<'a, Any> + Type<Any>,
    {
        for (i, v) in values.into_iter().enumerate() {
            if i > 0 {
                self.push(", ");
            }
            self.bind(v);
        }
        self
    }

    /// Appends `values (..), (..)`: `row` binds the columns of one item.
    pub(super) fn values<T, I>(
        &mut self,
        items: I,
        mut row: impl FnMut(&mut Tuple<'_, 'a>, T),
    ) -> &mut Self
    where
        I: IntoIterator<Item = T>,
    {
        self.push("values ");
        for (i, item) in items.into_iter().enumerate() {
            self.push(if i > 0 { ", (" } else { "(" });
            row(
                &mut Tuple {
                    sql: self,
                    first: true,
                },
                item,
            );
            self.push(")");
        }
        self
    }

    #[cfg(test)]
    pub(super) fn text(&self) -> &str {
        &self.text
    }

    fn into_parts(self) -> Result<(String, AnyArguments<'a>), StoreError> {
        match self.error {
            Some(e) => Err(StoreError::Unavailable(format!(
                "cannot encode an argument: {e}"
            ))),
            None => Ok((self.text, self.args)),
        }
    }

    pub(super) async fn fetch_all<'e, E>(self, executor: E) -> Result<Vec<AnyRow>, StoreError>
    where
        E: Executor<'e, Database = Any>,
    {
        let (text, args) = self.into_parts()?;
        Ok(sqlx::query_with(&text, args).fetch_all(executor).await?)
    }

    pub(super) async fn execute<'e, E>(self, executor: E) -> Result<AnyQueryResult, StoreError>
    where
        E: Executor<'e, Database = Any>,
    {
        let (text, args) = self.into_parts()?;
        Ok(sqlx::query_with(&text, args).execute(executor).await?)
    }

    /// The first column of every row.
    pub(super) async fn fetch_scalars<'e, T, E>(self, executor: E) -> Result<Vec<T>, StoreError>
    where
        E: Executor<'e, Database = Any>,
        T: Send + Unpin + for<'r> sqlx::Decode<'r, Any> + Type<Any>,
    {
        let (text, args) = self.into_parts()?;
        Ok(sqlx::query_scalar_with(&text, args)
            .fetch_all(executor)
            .await?)
    }
}

/// The columns of one row of a `values` list.
pub(super) struct Tuple<'s, 'a> {
    sql: &'s mut Sql<'a>,
    first: bool,
}

impl<'a> Tuple<'_, 'a> {
    pub(super) fn bind<T>(&mut self, value: T) -> &mut Self
    where
        T: 'a + Encode<'a, Any> + Type<Any>,
    {
        if !std::mem::take(&mut self.first) {
            self.sql.push(", ");
        }
        self.sql.bind(value);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_numbered_in_order() {
        let mut q = Sql::new(Backend::Postgres, "select * from t where a in (");
        q.list([1i64, 2, 3]).push(") and b = ").bind("x");
        assert_eq!(
            q.text(),
            "select * from t where a in ($1, $2, $3) and b = $4"
        );
        let mut v = Sql::new(Backend::Postgres, "insert into t (a, b) ");
        v.values([(1i64, "p"), (2, "q")], |row, (a, b)| {
            row.bind(a).bind(b);
        });
        assert_eq!(v.text(), "insert into t (a, b) values ($1, $2), ($3, $4)");
        let mut s = Sql::new(Backend::Sqlite, "select * from t where a in (");
        s.list([1i64, 2]).push(")");
        assert_eq!(s.text(), "select * from t where a in (?, ?)");
    }
}
