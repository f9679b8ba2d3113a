// Expect an Error with exactly this message.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

#define EXPECT_ERROR_MESSAGE(statement, message)                                  \
  do {                                                                            \
    std::string caught_message_ = "(no error)";                                   \
    try {                                                                         \
      statement;                                                                  \
    } catch (const ::moeserve::Error& e) {                                        \
      caught_message_ = e.what();                                                 \
    }                                                                             \
    EXPECT_EQ(caught_message_, std::string(message)) << "statement: " #statement; \
  } while (0)
