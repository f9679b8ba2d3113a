#include "kv/block_pool.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace moeserve::kv {
namespace {

TEST(BlockPool, AllocatesLowestPagesFirstAndRunsOut) {
  BlockPool pool(3);
  EXPECT_EQ(pool.free_pages(), 3);
  EXPECT_EQ(pool.allocate(), 0);
  EXPECT_EQ(pool.allocate(), 1);
  EXPECT_EQ(pool.allocate(), 2);
  EXPECT_EQ(pool.allocate(), std::nullopt);
  EXPECT_EQ(pool.free_pages(), 0);
}

TEST(BlockPool, PageIsFreeWhenTheLastHolderReleasesIt) {
  BlockPool pool(2);
  const int32_t page = *pool.allocate();
  pool.retain(page);
  EXPECT_EQ(pool.refcount(page), 2);
  EXPECT_FALSE(pool.release(page));
  EXPECT_EQ(pool.free_pages(), 1);
  EXPECT_TRUE(pool.release(page));
  EXPECT_EQ(pool.free_pages(), 2);
  EXPECT_EQ(pool.refcount(page), 0);
}

TEST(BlockPool, MisuseIsAnErrorNamingThePage) {
  BlockPool pool(2);
  EXPECT_THROW(pool.release(0), Error);
  EXPECT_THROW(pool.retain(1), Error);
  try {
    pool.refcount(7);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("page 7"), std::string::npos) << e.what();
  }
  EXPECT_THROW(BlockPool(0), Error);
}

}  // namespace
}  // namespace moeserve::kv
